// What the sidecar accepts, as far as the client checks it before sending: a request the
// sidecar could not even decode would end the whole stream, and every lock with it.
import { shortKey } from './errors.js';

/** The longest wait the sidecar accepts; `wait` undefined asks for it. */
export const MAX_WAIT_SECONDS = 24 * 3600;
/** The longest holder value the sidecar accepts (`Acquire.value`, `Proclaim.value`). */
export const MAX_VALUE_BYTES = 4096;
/**
 * The largest request the sidecar reads at all (its transport's limit, 4 MiB), less room
 * for the fields around the strings. Up to that size a bad request is answered
 * `Rejected` and the session goes on; above it gRPC ends the whole stream, and with it
 * every lock of the session, so the client refuses such a request before sending it.
 */
const MAX_SENDABLE_BYTES = 4 * 1024 * 1024 - 1024;

/** What the sidecar accepts of each name, for error messages (it checks the rest). */
const RULES = {
  key: 'a key is 1 to 512 bytes of UTF-8 without control characters',
  holder: 'a holder is at most 128 bytes of UTF-8 without control characters',
};

/**
 * Refuses, before anything is sent, a key or holder that cannot be encoded as UTF-8: a
 * JavaScript string with a lone surrogate (half of a UTF-16 pair). Protobuf would send
 * bytes that are not UTF-8, the sidecar could not decode the message, and gRPC would end
 * the whole stream, losing every lock of the session. Python refuses the same strings
 * (UnicodeEncodeError). Length and control characters are the sidecar's to judge: it
 * answers `Rejected` INVALID_ARGUMENT and the session goes on.
 */
export function checkText(name: keyof typeof RULES, text: unknown): string {
  if (typeof text !== 'string') throw new TypeError(`${name} must be a string, not ${typeof text}`);
  const lone = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.exec(text);
  if (lone) {
    const unit = `\\u${lone[0].charCodeAt(0).toString(16)}`;
    throw new RangeError(
      `${name} ${shortKey(text)} cannot be encoded as UTF-8: character '${unit}' at index ${lone.index} ` +
        `is a lone surrogate (${RULES[name]})`,
    );
  }
  return text;
}

/** Refuses a request too large for the sidecar to read (see `MAX_SENDABLE_BYTES`). */
export function checkSize(key: string, holder: string, value: Buffer): void {
  const bytes = Buffer.byteLength(key) + Buffer.byteLength(holder) + value.length;
  if (bytes > MAX_SENDABLE_BYTES) {
    throw new RangeError(
      `request for ${shortKey(key)} is ${bytes} bytes: more than the 4 MiB the sidecar reads, which would ` +
        `end the session (${RULES.key}, ${RULES.holder}, a value at most ${MAX_VALUE_BYTES} bytes)`,
    );
  }
}

/** A holder value as bytes: a string is sent as UTF-8. */
export function toValue(name: string, value: Uint8Array | string | undefined): Buffer {
  if (value === undefined) return Buffer.alloc(0);
  if (typeof value === 'string') return Buffer.from(value, 'utf8');
  if (value instanceof Uint8Array) return Buffer.from(value);
  throw new TypeError(`${name} must be a Uint8Array or a string, not ${typeof value}`);
}
