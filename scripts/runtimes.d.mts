/** Declarations of scripts/runtimes.mjs, for the tests that use it. */
export declare const ROOT: string
export declare const CACHE: string
export declare const MAIN_LINE: number
export declare const NODE_LINES: Record<number, string>
export declare const MINIMUM_NODE: string
export type Tool = 'npm' | 'npm11' | 'pnpm' | 'bun' | 'deno'
export declare const TOOLS: Record<Tool, string>
export declare function isSupportedNode(version?: string): boolean
export declare function withoutNpmConfig(env: NodeJS.ProcessEnv): Record<string, string>
export declare function nodeBinary(line: number): string
export declare function toolCommand(tool: Tool, node?: string): [string, ...string[]]
