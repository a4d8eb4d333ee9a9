// A TypeScript fragment that uses an open `client` (closed after it), with the
// stand-ins in scope: tests/client_doc_examples.rs puts it in place of the EXAMPLE line.
import { Client } from 'lockside';
import { batch, batches, data, db, work, write } from './stand_ins.mjs';
void [batch, batches, data, db, work, write];

const client = new Client();                   // $LOCKSIDE_ADDR
// EXAMPLE
await client.close();
