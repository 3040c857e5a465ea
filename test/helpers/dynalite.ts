import { randomUUID } from 'node:crypto'
import { createRequire } from 'node:module'
import type { AddressInfo, Server } from 'node:net'
import { DeleteTableCommand, DynamoDBClient } from '@aws-sdk/client-dynamodb'

/** dynalite ships no types: it makes a node:net-style HTTP server. */
const dynalite = createRequire(import.meta.url)('dynalite') as (options: Record<string, unknown>) => Server

/** A DynamoDB endpoint for the tests: the one in IDEMKEY_DYNAMODB_ENDPOINT (DynamoDB Local, AWS), or a dynalite server of our own. */
export interface DynamoDbEndpoint {
  endpoint: string | undefined
  /** A client on the endpoint, failing fast. */
  client(): DynamoDBClient
  /** A table name no other test uses. */
  table(label: string): string
  stop(): Promise<void>
}

/**
 * Starts an in-memory dynalite server on a free loopback port, unless `IDEMKEY_DYNAMODB_ENDPOINT` names
 * an endpoint to use instead (`http://127.0.0.1:8000` for DynamoDB Local; `aws` for the region in the
 * environment, with its credentials).
 */
export async function startDynamoDb(): Promise<DynamoDbEndpoint> {
  const configured = process.env.IDEMKEY_DYNAMODB_ENDPOINT
  let server: Server | undefined
  let endpoint: string | undefined
  if (configured === 'aws') endpoint = undefined
  else if (configured) endpoint = configured
  else {
    server = dynalite({ createTableMs: 0, deleteTableMs: 0, updateTableMs: 0 })
    await new Promise<void>((resolve, reject) => {
      server?.once('error', reject)
      server?.listen(0, '127.0.0.1', () => resolve())
    })
    endpoint = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  }
  const run = randomUUID().slice(0, 8)
  const clients: DynamoDBClient[] = []
  const tables = new Set<string>()
  return {
    endpoint,
    client() {
      const client = new DynamoDBClient({
        ...(endpoint === undefined ? {} : { endpoint, region: 'us-east-1', credentials: { accessKeyId: 'test', secretAccessKey: 'test' } }),
        maxAttempts: 1,
      })
      clients.push(client)
      return client
    },
    table(label) {
      const name = `idemkey-test-${label}-${run}`
      tables.add(name)
      return name
    },
    async stop() {
      if (!server && clients[0]) {
        // An outside endpoint (DynamoDB Local, AWS) keeps its tables: drop the ones the tests made.
        const client = clients[0]
        for (const name of tables) await client.send(new DeleteTableCommand({ TableName: name })).catch(() => {})
      }
      for (const client of clients) client.destroy()
      if (server) await new Promise<void>((resolve) => server?.close(() => resolve()))
    },
  }
}
