// A TypeScript fragment with the stand-ins in scope: tests/client_doc_examples.rs puts
// it in place of the EXAMPLE line, compiles with `tsc --strict` and runs the whole.
import { batch, batches, data, db, work, write } from './stand_ins.mjs';
void [batch, batches, data, db, work, write];

// EXAMPLE
