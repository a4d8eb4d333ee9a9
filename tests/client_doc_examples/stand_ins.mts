// Stand-ins for the application's own things that the docs' TypeScript fragments use
// (`db`, `batch`, `batches`, `data`, `write`, `work`), imported by the wrappers.

const encoder = new TextEncoder();

export interface Fenced {
  fencingToken: bigint;
  signal?: AbortSignal;
}

export const data = encoder.encode('the report');
export const batch = encoder.encode('a batch');
export const batches = [batch, encoder.encode('another batch')];

/** A resource that takes the fencing token with every write. */
export const db = {
  async write(what: Uint8Array, { fencingToken, signal }: Fenced): Promise<void> {
    signal?.throwIfAborted();
    console.log(`wrote ${what.length} bytes with fencing token ${fencingToken}`);
  },
};

export async function write(what: Uint8Array, fenced: Fenced): Promise<void> {
  await db.write(what, fenced);
}

export async function work(fenced: Fenced): Promise<void> {
  await db.write(data, fenced);
}
