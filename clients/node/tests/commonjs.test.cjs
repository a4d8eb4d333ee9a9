// The CommonJS build loads and exports the same API as the ES module build.
const assert = require('node:assert/strict');
const { test } = require('node:test');

test('require("lockside") gives the CommonJS build with the same exports', async () => {
  const cjs = require('lockside');
  const esm = await import('lockside');
  for (const name of ['Client', 'Lock', 'LocksideError', 'NotAcquired', 'Rejected', 'LockLost', 'Unavailable']) {
    assert.equal(typeof cjs[name], 'function', name);
    assert.equal(typeof esm[name], 'function', name);
  }
  assert.notEqual(cjs.Client, esm.Client); // two builds, not one re-exported
  assert.ok(new cjs.NotAcquired('k', 'BUSY') instanceof cjs.LocksideError);
});
