// The API client: every call carries the signed-in token, and every failure becomes one
// readable sentence (the server's own `{"error": …}` text when it sent one), never raw JSON.

import type { components } from "./generated/schema";

const KEY = "gantry.token";
export const token = {
  get: (): string | null => sessionStorage.getItem(KEY),
  set: (t: string) => sessionStorage.setItem(KEY, t),
  clear: () => sessionStorage.removeItem(KEY),
};

export class ApiError extends Error {
  constructor(message: string, readonly status: number) { super(message); }
}

const STATUS_WORDS: Record<number, string> = {
  400: "The request was not accepted",
  401: "Your token was not accepted; sign in again",
  403: "Your role may not do this",
  404: "Not found",
  409: "That conflicts with the current state",
  413: "The file is too large",
  422: "The policy did not pass validation",
  503: "The server is not ready yet",
};

async function failure(res: Response): Promise<ApiError> {
  let detail = "";
  try {
    const body = await res.json();
    if (body && typeof body.error === "string") detail = body.error;
  } catch { /* not JSON: fall back to the status words */ }
  const head = STATUS_WORDS[res.status] ?? `The server answered ${res.status}`;
  return new ApiError(detail ? `${head}: ${detail}` : `${head}.`, res.status);
}

export async function call<T>(path: string, init: RequestInit = {}, tok = token.get()): Promise<T> {
  const headers = new Headers(init.headers);
  if (tok) headers.set("Authorization", `Bearer ${tok}`);
  let res: Response;
  try {
    res = await fetch(path, { ...init, headers });
  } catch (e) {
    throw new ApiError(`Cannot reach the Gantry server (${(e as Error).message}).`, 0);
  }
  if (!res.ok) throw await failure(res);
  return (await res.json()) as T;
}

export const get = <T>(path: string) => call<T>(path);
/** A POST with a JSON body of type `B` (a generated request type, so it is checked too). */
export const post = <T, B = unknown>(path: string, body?: B) =>
  call<T>(path, {
    method: "POST",
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });

export function message(e: unknown): string {
  if (e instanceof ApiError) return e.message;
  if (e instanceof Error) return `Something went wrong: ${e.message}`;
  return "Something went wrong.";
}

/** The SSE decision feed over `fetch`, because EventSource cannot send the Authorization
 * header. Calls `onEvent` with each decision's JSON until `signal` aborts. */
export async function stream(
  path: string, signal: AbortSignal, onEvent: (data: string) => void,
): Promise<void> {
  const res = await fetch(path, { headers: { Authorization: `Bearer ${token.get()}` }, signal });
  if (!res.ok || !res.body) throw await failure(res);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut: number;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data) onEvent(data);
    }
  }
}

// The shapes the pages read and send: the server's own types, from the OpenAPI document it
// derives from them (src/generated/openapi.json, checked in), turned into TypeScript by
// openapi-typescript at every build (src/generated/schema.d.ts). A field the server drops or
// renames fails `tsc` here instead of showing blanks in a page. The names are the pages'.
type Schemas = components["schemas"];
export type Caller = Schemas["Caller"];
export type Role = Schemas["Role"];
export type NodeColumns = Schemas["NodeColumns"];
export type NodeDetail = Schemas["NodeDetail"];
export type Queue = Schemas["QueueView"];
export type QueueSeries = Schemas["QueueSeries"];
export type QueueHistory = Schemas["QueueHistoryView"];
export type JobRow = Schemas["JobRow"];
/** When a pending job is expected to start (ms since the epoch), from the planner. */
export type Estimate = Schemas["EstimateView"];
export type WhatIfJob = Schemas["WhatIfJob"];
export type WhatIfOutcome = Schemas["WhatIfOutcome"];
export type WhatIfAnswer = Schemas["WhatIfAnswer"];
export type PolicyRef = Schemas["PolicyRef"];
export type Explanation = Schemas["Explanation"];
export type DecisionRecord = Schemas["DecisionRecord"];
export type Explain = Schemas["Explain"];
/** One step of a job's life: placed, preempted (by whom) or pending. */
export type JobEvent = Schemas["JobEvent"];
/** The data of one `decision` event of the SSE feed. */
export type DecisionEvent = Schemas["DecisionEvent"];
export type Manifest = Schemas["PolicyManifest"];
export type Upload = Schemas["Upload"];
export type SetEntry = Schemas["SetEntry"];
export type PolicySet = Schemas["PolicySet"];
export type NewSet = Schemas["NewSet"];
export type SetList = Schemas["SetList"];
export type RunningPolicy = Schemas["RunningPolicy"];
export type Validation = Schemas["Validation"];
export type ShadowReport = Schemas["ShadowReport"];
export type AuditEntry = Schemas["AuditEntry"];
/** Where a node stands in its health lifecycle: `preflight`, `ready`, `suspect`, … */
export type NodeState = Schemas["NodeState"];
export type HealthView = Schemas["HealthView"];
export type NodeHealth = Schemas["NodeHealthView"];
export type Transition = Schemas["TransitionView"];
export type BreakerReset = Schemas["BreakerReset"];
/** A node a job avoids because it failed under it: why the job restarted. */
export type BadNode = Schemas["BadNodeView"];
