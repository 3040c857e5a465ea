/**
 * Test suites any store can run: the store contract (docs/ledger.md, "Writing your own store") and a
 * property-based model test.
 *
 * @example
 * import { describeStore, describeStoreModel } from 'idemkey/testing'
 * describeStore('my-store', ({ clock }) => new MyStore({ clock }))
 * describeStoreModel('my-store', ({ clock }) => new MyStore({ clock }))
 */
export { describeSkipped, resolveHarness, type SuiteOptions, type TestHarness } from './harness.js'
export { describeStore, fp, type StoreContractOptions, type StoreFactory, sampleOutcome } from './store-contract.js'
export { describeStoreModel, type StoreModelOptions } from './store-model.js'
