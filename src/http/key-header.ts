/** The key header's rules live in core (the client reads the header too); the HTTP layer imports them from here. */
export { KEY_HEADER, KEY_HEADER_NAME, keyHeaderName, parseKeyHeader } from '../core/key-header.js'
