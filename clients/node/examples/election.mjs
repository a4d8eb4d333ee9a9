// Leader election with the `lockside` package. Start several copies: one leads at a
// time, in the order they started; the others print who leads and take over, in turn,
// when it goes (Ctrl-C resigns; a killed leader's sidecar releases at once).
//
//   node election.mjs jobs/leader "$(hostname):8080"
//
// The leader's work gets the fencing token and an AbortSignal that fires the moment
// leadership is suspended or lost.
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { Client } from 'lockside';

const [key, me] = process.argv.slice(2);

/** What a follower does with each state: know who leads (and where). */
async function follow(client) {
  for await (const state of client.watch(key)) {
    if (state.leader) console.log(`leader: ${state.leader.value} (token ${state.leader.fencingToken})`);
    else console.log('no leader: the next candidate takes over');
  }
}

async function work(token, signal) {
  console.log(`leading: working with fencing token ${token}`);
  await sleep(1000, undefined, { signal });
}

const watcher = new Client();
follow(watcher).catch((e) => console.error(`watch: ${e.message}`));
const client = new Client(undefined, { clientName: me });
let lead;
try {
  lead = await client.campaign(key, me); // resolves once this copy leads
} catch (e) {
  console.error(`campaign: ${e.message}`);
  process.exit(1);
}
process.once('SIGINT', async () => {
  await lead.release().catch(() => {}); // resign: the next candidate leads now
  await Promise.all([client.close(), watcher.close()]);
  process.exit(0);
});
// Work while leading. When the stream to the sidecar breaks, leadership is suspended at
// once (the signal aborts the work): a live sidecar may already have let the next
// candidate lead. Wait until it is restored (the resumed session kept it) or lost.
for (;;) {
  if (lead.suspended) {
    console.log('suspended: the stream to the sidecar broke; not working until it is restored or lost');
    await Promise.race([once(lead, 'restored'), lead.lost]);
  }
  if (!lead.held) break;
  await work(lead.fencingToken, lead.signal).catch(() => {}); // aborted: suspended or lost
}
if (lead.lostReason !== undefined) {
  console.log(`leadership lost: ${lead.lostReason}`);
  process.exit(1);
} // else resigned (SIGINT)
