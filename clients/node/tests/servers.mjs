// Real servers for the tests and the benchmark: a redis-server on a free loopback port
// and the `lockside` sidecar binary on it, started by the caller and stopped by it.
// The binary: $LOCKSIDE_BIN, else the newest of target/debug/lockside and
// target/release/lockside in the Lockside checkout above this directory (`cargo build`).
import { spawn } from 'node:child_process';
import { accessSync, constants, existsSync, mkdtempSync, openSync, readFileSync, rmSync, statSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

const STARTUP_MS = 15000;

export function freePort() {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address();
      server.close(() => ok(port));
    });
  });
}

export function sidecarBinary() {
  if (process.env.LOCKSIDE_BIN) {
    accessSync(process.env.LOCKSIDE_BIN, constants.X_OK);
    return process.env.LOCKSIDE_BIN;
  }
  for (let dir = dirname(fileURLToPath(import.meta.url)); dir !== dirname(dir); dir = dirname(dir)) {
    const cargo = join(dir, 'Cargo.toml');
    if (existsSync(cargo) && /^name\s*=\s*"lockside"/m.test(readFileSync(cargo, 'utf8'))) {
      const built = ['debug', 'release']
        .map((p) => join(dir, 'target', p, 'lockside'))
        .filter((p) => existsSync(p));
      if (!built.length) throw new Error(`no lockside binary under ${dir}/target: run \`cargo build\` there`);
      return built.sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0];
    }
  }
  throw new Error('set LOCKSIDE_BIN to the lockside binary (not in a Lockside checkout)');
}

function ping(port) {
  return new Promise((ok) => {
    const socket = createConnection({ host: '127.0.0.1', port }, () => socket.write('PING\r\n'));
    socket.setTimeout(1000, () => socket.destroy());
    socket.once('data', (d) => {
      socket.destroy();
      ok(d.toString().startsWith('+PONG'));
    });
    socket.once('error', () => ok(false));
    socket.once('close', () => ok(false));
  });
}

function exited(child) {
  return child.exitCode !== null || child.signalCode !== null;
}

function stopChild(child, signal = 'SIGKILL') {
  if (exited(child)) return Promise.resolve();
  return new Promise((ok) => {
    child.once('exit', () => ok());
    child.kill(signal);
  });
}

/** One Redis command in RESP on a new connection; resolves the raw reply. */
function redisCommand(port, args) {
  return new Promise((ok, fail) => {
    let request = `*${args.length}\r\n`;
    for (const a of args) request += `$${Buffer.byteLength(a)}\r\n${a}\r\n`;
    const socket = createConnection({ host: '127.0.0.1', port }, () => socket.write(request));
    socket.setTimeout(5000, () => socket.destroy(new Error('redis: no reply')));
    socket.once('data', (d) => {
      socket.destroy();
      ok(d.toString());
    });
    socket.once('error', fail);
  });
}

export class Stack {
  /** Starts a Redis and one sidecar on it; every sidecar gets `sidecarArgs`. */
  static async start({ sidecarArgs = [] } = {}) {
    const stack = new Stack();
    stack.dir = mkdtempSync(join(tmpdir(), 'lockside-node-'));
    stack.sidecars = [];
    stack.sidecarArgs = sidecarArgs;
    await stack.startRedis();
    try {
      stack.sidecar = await stack.startSidecar();
    } catch (e) {
      await stack.stop();
      throw e;
    }
    return stack;
  }

  get addr() {
    return this.sidecar.addr;
  }

  async startRedis() {
    for (let attempt = 0; attempt < 5; attempt++) {
      const port = await freePort();
      const child = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '',
        '--appendonly', 'no', '--dir', this.dir], { stdio: 'ignore' });
      child.on('error', () => {}); // a missing redis-server shows as "did not start"
      const deadline = Date.now() + STARTUP_MS;
      while (Date.now() < deadline && !exited(child)) {
        if (await ping(port)) {
          this.redis = {
            port,
            url: `redis://127.0.0.1:${port}`,
            child,
            stop: () => stopChild(child),
            command: (...args) => redisCommand(port, args),
          };
          return;
        }
        await sleep(20);
      }
      await stopChild(child);
    }
    throw new Error('redis-server did not start (is it installed?)');
  }

  /** Another sidecar on this stack's Redis (or on `store`, e.g. 'memory'). */
  async startSidecar(listen = '127.0.0.1:0', store = this.redis.url) {
    const log = join(this.dir, `sidecar-${this.sidecars.length}.log`);
    const out = openSync(log, 'w');
    const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('LOCKSIDE_')));
    const child = spawn(sidecarBinary(), ['serve', '--listen', listen, '--admin-listen', '127.0.0.1:0',
      '--store', store, ...this.sidecarArgs], { stdio: ['ignore', out, out], env });
    const sidecar = { child, stop: () => stopChild(child, 'SIGTERM'), kill: () => stopChild(child) };
    this.sidecars.push(sidecar);
    const deadline = Date.now() + STARTUP_MS;
    while (Date.now() < deadline && !exited(child)) {
      const m = / listening address=(\S+)/.exec(readFileSync(log, 'utf8'));
      if (m) {
        sidecar.addr = m[1];
        return sidecar;
      }
      await sleep(20);
    }
    throw new Error(`the sidecar did not start:\n${readFileSync(log, 'utf8')}`);
  }

  /** SIGKILLs the sidecar and starts another on its address and Redis (as the kubelet
   * restarts a crashed native sidecar in place). */
  async restartSidecar() {
    const addr = this.sidecar.addr;
    await this.sidecar.kill();
    this.sidecar = await this.startSidecar(addr);
    return this.sidecar;
  }

  /** Whether the session's record in the store lists `keys` keys: the sidecar's journal
   * writes a grant there once it has been held 50 ms, and only that can be resumed. */
  async recorded(sessionId, keys, namespace = 'lockside') {
    const reply = await this.redis.command('HLEN', `{${namespace}:session/${sessionId}}:s`);
    return reply.startsWith(':') && Number(reply.slice(1).trim()) === 3 + keys;
  }

  async stop() {
    for (const s of this.sidecars) await s.stop();
    if (this.redis) await this.redis.stop();
    rmSync(this.dir, { recursive: true, force: true });
  }
}

