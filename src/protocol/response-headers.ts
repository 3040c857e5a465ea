/** Header names of idemkey's stored and replayed responses, shared by the stores and the HTTP layer. */
/** Marks a replay whose body was too large to store: its value is the original length in bytes. */
export const BODY_OMITTED_HEADER = 'idempotent-body-omitted'
/** Set to `true` on every replayed response. */
export const REPLAYED_HEADER = 'idempotent-replayed'
