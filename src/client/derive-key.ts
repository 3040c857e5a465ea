/** deriveKey lives in core (durable steps use it too); the client exports it from here as before. */
export { deriveKey } from '../core/derive-key.js'
