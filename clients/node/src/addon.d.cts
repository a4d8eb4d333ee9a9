// The addon's API (native/*.rs, napi-rs), as the package's TypeScript calls it
// (src/addon.cjs loads it). Not a public API: use the package's own exports.
export interface NativeTls {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
  serverName?: string;
}
export interface NativeHolder {
  sessionId: string;
  holder: string;
  holdCount: number;
  ttlRemaining: number;
  clientName: string;
  value: Buffer;
  fencingToken: string;
}
export interface NativeWaiter {
  sessionId: string;
  holder: string;
  clientName: string;
  mode: number;
  position: number;
}
export interface NativeDescription {
  key: string;
  mode: number;
  limit: number;
  holders: NativeHolder[];
  waiters: number;
  fencingToken: string;
  queue: NativeWaiter[];
}
export declare class NativeLock {
  readonly id: number;
  readonly key: string;
  readonly holder: string;
  readonly fencingToken: string;
  readonly ttl: number;
  readonly holdCount: number;
  readonly sessionId: string;
  state(): 'held' | 'suspended' | 'lost';
  reason(): string;
  release(): void;
  proclaim(value: Buffer): Promise<void>;
}
export declare class NativeWatch {
  next(): Promise<NativeDescription | null | undefined>;
  cancel(): void;
}
export declare class NativeClient {
  constructor(
    addr: string,
    clientName: string | undefined | null,
    authToken: string | undefined | null,
    tls: NativeTls | undefined | null,
    connectTimeout: number,
    resume: boolean,
  );
  sessionId(): string | null;
  acquire(
    request: number,
    key: string,
    wait: number | undefined | null,
    ttl: number | undefined | null,
    shared: boolean,
    limit: number,
    fair: boolean,
    value: Buffer,
    holder: string | undefined | null,
  ): Promise<NativeLock>;
  acquireAll(
    request: number,
    keys: string[],
    wait: number | undefined | null,
    ttl: number | undefined | null,
    shared: boolean,
    fair: boolean,
    holder: string | undefined | null,
  ): Promise<NativeLock[]>;
  giveUp(request: number): void;
  describe(key: string, timeout: number): Promise<NativeDescription>;
  watch(key: string): NativeWatch;
  close(): Promise<void>;
}
/** `kind` 'state': `id` a lock's, `state` its new state, `reason` why; `kind` 'log': `state`
 * the level ('info' | 'warn' | 'error'), `reason` the line. */
export declare function setListener(callback: (news: [kind: string, id: number, state: string, reason: string]) => void): void;
