// Leader election with the `lockside` package. Start several copies: one leads at a
// time, in the order they started; the others print who leads and take over, in turn,
// when it goes (Ctrl-C resigns; a killed leader's sidecar releases at once).
//
//   node election.mjs jobs/leader "$(hostname):8080"
//
// The leader's work gets the fencing token and an AbortSignal that fires the moment
// leadership is lost.
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
try {
  while (lead.held) await work(lead.fencingToken, lead.signal); // stops when leadership is lost
} catch {
  console.log(`leadership lost: ${lead.lostReason}`);
  process.exit(1);
}
