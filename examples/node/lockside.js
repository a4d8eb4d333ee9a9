'use strict';
// A small promise-based client for the Lockside sidecar.
//
//   const { Client } = require('./lockside');
//   const client = new Client('127.0.0.1:7420');
//   const lock = await client.lock('orders', { wait: 30 });
//   try {
//     await writeSomething({ fencingToken: lock.fencingToken, signal: lock.signal });
//   } finally {
//     await lock.release();
//     client.close();
//   }
//
// Every lock gets its own `Lease` stream, so the sidecar keeps the lock exactly as long
// as that stream lives. Any stream error or end counts as losing the lock (`lock.lost`).
// The .proto file is loaded at run time; nothing is generated.

const path = require('node:path');
const { EventEmitter } = require('node:events');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO_ROOT = path.join(__dirname, '..', '..', 'proto');
const PROTO_FILE = 'lockside/v1/lockside.proto';

// HTTP/2 keepalive well below the lock TTL (DESIGN.md, "Client guidance"): a frozen or
// unreachable sidecar is noticed in about 2 s, before the store can let a lock go.
const CHANNEL_OPTIONS = {
  'grpc.keepalive_time_ms': 1000,
  'grpc.keepalive_timeout_ms': 1000,
  'grpc.keepalive_permit_without_calls': 1,
};

let cachedService;
function loadService() {
  if (!cachedService) {
    const definition = protoLoader.loadSync(PROTO_FILE, {
      includeDirs: [PROTO_ROOT],
      longs: String, // uint64 fencing tokens and request ids arrive as decimal strings
      enums: String,
      defaults: true,
      oneofs: true, // `event` / `command` name the field that is set
    });
    cachedService = grpc.loadPackageDefinition(definition).lockside.v1.LockService;
  }
  return cachedService;
}

/** google.rpc.Code names for the numbers `Rejected.code` carries. */
const RPC_CODE_NAMES = Object.fromEntries(
  Object.entries(grpc.status).map(([name, value]) => [value, name]),
);

/**
 * The error `client.lock()` rejects with.
 * - `NotAcquired`: `reason` is 'BUSY', 'TIMEOUT' or 'CANCELLED'.
 * - `Rejected`: `code` is the google.rpc.Code number (e.g. 3 INVALID_ARGUMENT,
 *   14 UNAVAILABLE) and `codeName` its name.
 * - a stream failure: `code` is the gRPC status code of the stream.
 */
class LocksideError extends Error {
  constructor(message, { key, reason, code } = {}) {
    super(message);
    this.name = 'LocksideError';
    this.key = key;
    if (reason !== undefined) this.reason = reason;
    if (code !== undefined) {
      this.code = code;
      this.codeName = RPC_CODE_NAMES[code];
    }
  }
}

/** Seconds (a number, fractions allowed) to a google.protobuf.Duration. */
function toDuration(seconds, name) {
  if (typeof seconds !== 'number' || !Number.isFinite(seconds)) {
    throw new TypeError(`${name} must be a finite number of seconds, got ${seconds}`);
  }
  let whole = Math.trunc(seconds);
  let nanos = Math.round((seconds - whole) * 1e9);
  if (Math.abs(nanos) >= 1e9) {
    whole += Math.sign(nanos);
    nanos = 0;
  }
  return { seconds: String(whole), nanos };
}

/** A google.protobuf.Duration (with `longs: String`) to milliseconds. */
function durationMs(d) {
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : 0;
}

/**
 * A held lock. Created by `client.lock()`; do not construct it yourself.
 *
 * Events: 'jeopardy' ({ ttlRemainingMs }), 'restored' ({ ttlMs }), 'lost' (info).
 */
class Lock extends EventEmitter {
  constructor(key, call, granted) {
    super();
    this.key = key;
    /** The fencing token of this grant, a BigInt: pass it to the resource you protect. */
    this.fencingToken = BigInt(granted.fencingToken);
    /** Validity left when the grant was sent (the sidecar keeps renewing it). */
    this.ttlMs = durationMs(granted.ttl);
    this._call = call;
    this._state = 'held'; // held -> releasing -> released | lost
    this._release = null; // { resolve, reject } while a Release is pending
    const controller = new AbortController();
    /** Aborted when the lock is lost; hand it to work that must stop at once. */
    this.signal = controller.signal;
    /**
     * Resolves with { key, reason, fencingToken, error? } when the lock is lost: a `Lost`
     * event, or any error or end of the stream. Never settles after a clean release.
     */
    this.lost = new Promise((resolve) => {
      this._onLost = (info) => {
        resolve(info);
        controller.abort(Object.assign(new LocksideError(`lock ${key} lost: ${info.reason}`,
          { key }), { lost: info }));
        this.emit('lost', info);
      };
    });
  }

  /** True while the lock is held (not released, not lost). */
  get held() {
    return this._state === 'held' || this._state === 'releasing';
  }

  _handle(event, msg) {
    switch (event) {
      case 'lost':
        if (msg.key === this.key) this._lose(msg.reason || 'lost', undefined);
        break;
      case 'jeopardy':
        if (msg.key === this.key) this.emit('jeopardy', { ttlRemainingMs: durationMs(msg.ttlRemaining) });
        break;
      case 'restored':
        if (msg.key === this.key) this.emit('restored', { ttlMs: durationMs(msg.ttl) });
        break;
      case 'released':
        if (this._release && msg.requestId === '2') this._finishRelease(null);
        break;
      case 'rejected':
        if (this._release && msg.requestId === '2') {
          this._finishRelease(new LocksideError(
            `release of ${this.key} rejected: ${RPC_CODE_NAMES[msg.code] || msg.code}: ${msg.message}`,
            { key: this.key, code: msg.code }));
        }
        break;
      default:
        break;
    }
  }

  // The stream failed or ended while the lock was held.
  _streamGone(err) {
    if (this._state === 'released' || this._state === 'lost') return;
    const reason = err ? `stream error: ${err.message}` : 'stream ended';
    this._lose(reason, err);
  }

  _lose(reason, error) {
    if (this._state === 'released' || this._state === 'lost') return;
    this._state = 'lost';
    const info = { key: this.key, reason, fencingToken: this.fencingToken };
    if (error) info.error = error;
    // A loss during release: the lock is not held any more, which is what release wanted.
    if (this._release) this._finishRelease(null);
    this._call.cancel(); // the session has nothing left to hold
    this._onLost(info);
  }

  _finishRelease(err) {
    const pending = this._release;
    this._release = null;
    clearTimeout(pending.timer);
    if (this._state === 'releasing') this._state = 'released';
    this._call.end(); // closing the stream ends the session
    if (err) pending.reject(err);
    else pending.resolve();
  }

  /**
   * Sends Release, waits for Released and ends the stream. Resolves quietly if the lock
   * was already released or lost. If no answer comes within `timeoutMs`, the stream is
   * cancelled (which makes the sidecar release the lock) and the promise rejects.
   */
  release({ timeoutMs = 5000 } = {}) {
    if (this._state === 'released' || this._state === 'lost') return Promise.resolve();
    if (this._state === 'releasing') return this._releasePromise;
    this._state = 'releasing';
    this._releasePromise = new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._release = null;
        this._state = 'released';
        this._call.cancel();
        reject(new LocksideError(`no answer to the release of ${this.key} within ${timeoutMs} ms; ` +
          'stream cancelled, the sidecar releases the lock', { key: this.key }));
      }, timeoutMs);
      this._release = { resolve, reject, timer };
      this._call.write({ release: { requestId: '2', key: this.key } });
    });
    return this._releasePromise;
  }
}

class Client {
  /**
   * @param {string} [addr] host:port or unix:/path of the sidecar; defaults to
   *   $LOCKSIDE_ADDR, then 127.0.0.1:7420.
   * @param {object} [options]
   * @param {string} [options.clientName] sent as `lockside-client-name`, shown by Describe.
   * @param {object} [options.channelOptions] extra gRPC channel options.
   */
  constructor(addr = process.env.LOCKSIDE_ADDR || '127.0.0.1:7420', options = {}) {
    const Service = loadService();
    this.addr = addr;
    this.clientName = options.clientName;
    this._stub = new Service(addr, grpc.credentials.createInsecure(),
      { ...CHANNEL_OPTIONS, ...options.channelOptions });
  }

  /**
   * Takes `key` on a new Lease stream.
   *
   * @param {string} key
   * @param {object} [opts]
   * @param {number} [opts.wait] seconds to wait when the key is busy (default: 0, fail at once).
   * @param {number} [opts.ttl] store TTL in seconds (default: the sidecar's, 10 s).
   * @param {'exclusive'|'shared'} [opts.mode]
   * @param {number} [opts.limit] N > 1 makes the key a counting semaphore.
   * @param {boolean} [opts.fair] FIFO among waiters.
   * @param {AbortSignal} [opts.signal] abort a pending acquire (the stream is cancelled).
   * @param {(position: number) => void} [opts.onWaiting] called when the request queues.
   * @returns {Promise<Lock>}
   */
  lock(key, opts = {}) {
    const acquire = { requestId: '1', key };
    if (opts.wait) acquire.waitTimeout = toDuration(opts.wait, 'wait');
    if (opts.ttl !== undefined) acquire.ttl = toDuration(opts.ttl, 'ttl');
    if (opts.mode) acquire.mode = `LOCK_MODE_${String(opts.mode).toUpperCase()}`;
    if (opts.limit !== undefined) acquire.limit = opts.limit;
    if (opts.fair) acquire.fair = true;
    const { signal, onWaiting } = opts;
    if (signal && signal.aborted) return Promise.reject(signal.reason);

    return new Promise((resolve, reject) => {
      const metadata = new grpc.Metadata();
      if (this.clientName) metadata.set('lockside-client-name', this.clientName);
      const call = this._stub.Lease(metadata);
      let phase = 'starting'; // starting -> acquiring -> held | failed
      let lock = null;

      // After an answer from the sidecar the stream is closed politely (end); after a
      // stream error or an abort it is cancelled.
      const fail = (err, { graceful = false } = {}) => {
        if (phase === 'held' || phase === 'failed') return;
        phase = 'failed';
        if (signal) signal.removeEventListener('abort', onAbort);
        if (graceful) call.end();
        else call.cancel();
        reject(err);
      };
      const onAbort = () => fail(signal.reason);
      if (signal) signal.addEventListener('abort', onAbort, { once: true });

      call.on('data', (msg) => {
        const event = msg.event;
        const body = msg[event];
        if (phase === 'held') {
          lock._handle(event, body);
          return;
        }
        if (phase === 'starting') {
          if (event !== 'started') {
            fail(new LocksideError(`protocol error: first message was ${event}, not started`, { key }));
            return;
          }
          phase = 'acquiring';
          call.write({ acquire });
          return;
        }
        if (phase !== 'acquiring' || body.requestId !== '1') return;
        switch (event) {
          case 'waiting':
            if (onWaiting) onWaiting(body.position);
            break;
          case 'granted':
            phase = 'held';
            if (signal) signal.removeEventListener('abort', onAbort);
            lock = new Lock(key, call, body);
            resolve(lock);
            break;
          case 'notAcquired': {
            const reason = String(body.reason).replace(/^REASON_/, '');
            fail(new LocksideError(`lock ${key} not acquired: ${reason}`, { key, reason }),
              { graceful: true });
            break;
          }
          case 'rejected':
            fail(new LocksideError(
              `lock ${key} rejected: ${RPC_CODE_NAMES[body.code] || body.code}: ${body.message}`,
              { key, code: body.code }), { graceful: true });
            break;
          default:
            break;
        }
      });
      call.on('error', (err) => {
        // Cancellations we made ourselves end up here too; they are not news.
        if (lock) lock._streamGone(err);
        else {
          const details = String(err.details || err.message).replace(/\s*Resolution note:\s*$/, '');
          fail(new LocksideError(`lease stream to ${this.addr} failed: ${details}`, { key, code: err.code }));
        }
      });
      call.on('end', () => {
        if (lock) lock._streamGone(null);
        else fail(new LocksideError('lease stream ended before the acquire was answered', { key }));
      });
    });
  }

  /**
   * Runs `fn(lock)` while holding `key` and releases afterwards, also when `fn` throws.
   * `lock.signal` is aborted if the lock is lost meanwhile.
   */
  async withLock(key, opts, fn) {
    const lock = await this.lock(key, opts);
    try {
      return await fn(lock);
    } finally {
      await lock.release();
    }
  }

  /** Describe(key): the store's view of one key; fencingToken is a BigInt. */
  describe(key, { timeoutMs = 5000 } = {}) {
    return new Promise((resolve, reject) => {
      this._stub.Describe({ key }, { deadline: Date.now() + timeoutMs }, (err, res) => {
        if (err) reject(err);
        else resolve({ ...res, fencingToken: BigInt(res.fencingToken) });
      });
    });
  }

  /** Closes the channel. Streams still open are cut, which releases their locks. */
  close() {
    this._stub.close();
  }
}

module.exports = { Client, Lock, LocksideError };
