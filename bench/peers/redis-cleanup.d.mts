/** Deletes every key matching one of `patterns` on the Redis at `url` (REDIS_URL, else the local one): see redis-cleanup.mjs. */
export function unlinkMatching(patterns: string[], url?: string): Promise<void>
