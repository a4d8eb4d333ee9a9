// The wire: the types scripts/build.mjs generates into src/gen/ (proto-loader-gen-types,
// do not edit) under the names the rest of the code uses, the service client they type,
// and conversions between seconds and `google.protobuf.Duration`.
//
// A `__Output` type is a message as @grpc/proto-loader decodes it with the options in
// `lockService()`; the plain name is what grpc-js accepts to encode.
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';
import { descriptor } from './gen/descriptor.js';
import type { Duration__Output } from './gen/google/protobuf/Duration.js';
import type { ProtoGrpcType } from './gen/lockside.js';
import type { DescribeResponse__Output } from './gen/lockside/v1/DescribeResponse.js';
import type { Granted__Output } from './gen/lockside/v1/Granted.js';
import type { LeaseRequest } from './gen/lockside/v1/LeaseRequest.js';
import type { LeaseResponse__Output } from './gen/lockside/v1/LeaseResponse.js';
import type { LockServiceClient } from './gen/lockside/v1/LockService.js';
import type { NotAcquired__Output } from './gen/lockside/v1/NotAcquired.js';
import type { Proclaimed__Output } from './gen/lockside/v1/Proclaimed.js';
import type { Rejected__Output } from './gen/lockside/v1/Rejected.js';
import type { Released__Output } from './gen/lockside/v1/Released.js';

export type { Acquire } from './gen/lockside/v1/Acquire.js';
export type { LeaseRequest, LockServiceClient };
export type Duration = Duration__Output;
export type GrantedMsg = Granted__Output;
export type LeaseResponse = LeaseResponse__Output;
/** `SessionStarted`: the first message of every Lease stream. */
export type StartedMsg = NonNullable<LeaseResponse['started']>;
export type DescribeResponseMsg = DescribeResponse__Output;
/** A final answer to a request, matched to it by `requestId`. */
export type AnswerMsg = Granted__Output | NotAcquired__Output | Released__Output | Rejected__Output | Proclaimed__Output;
/** A session's stream. */
export type LeaseCall = grpc.ClientDuplexStream<LeaseRequest, LeaseResponse>;
type LockServiceCtor = ProtoGrpcType['lockside']['v1']['LockService'];

let serviceCtor: LockServiceCtor | undefined;
/** The generated client's constructor. The options are those scripts/build.mjs
 * generates the wire types with: the types say what this decodes. */
export function lockService(): LockServiceCtor {
  if (!serviceCtor) {
    const definition = protoLoader.fromJSON(descriptor, {
      longs: String, // uint64 fencing tokens and request ids as decimal strings
      enums: String,
      defaults: true,
      oneofs: true, // `event` names the field that is set
    });
    const pkg = grpc.loadPackageDefinition(definition) as unknown as ProtoGrpcType;
    serviceCtor = pkg.lockside.v1.LockService;
  }
  return serviceCtor;
}

/** Seconds in a `Duration` (0 for none). */
export function seconds(d: Duration | null | undefined): number {
  return d ? Number(d.seconds) + d.nanos / 1e9 : 0;
}

/** `value` seconds as a `Duration`; `name` says which option was wrong. */
export function duration(name: string, value: number): { seconds: number; nanos: number } {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new RangeError(`${name} must be a finite number of seconds >= 0, got ${String(value)}`);
  }
  const whole = Math.trunc(value);
  return { seconds: whole, nanos: Math.round((value - whole) * 1e9) };
}
