// The API client: every call carries the signed-in token, and every failure becomes one
// readable sentence (the server's own `{"error": …}` text when it sent one), never raw JSON.

export type Role = "viewer" | "admin";
export interface Caller { name: string; role: Role }

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
export const post = <T>(path: string, body?: unknown) =>
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

// The shapes the pages read (see /api/openapi.json).
export interface NodeColumns {
  at_ms: number; name: string[]; gpu_type: string[]; gpu_total: number[]; gpu_free: number[];
  health: string[]; levels: [string, number[]][]; jobs: number[]; queues: string[];
}
export interface Queue {
  name: string; parent: string | null; nominal_gpus: number; used_gpus: number; borrowed_gpus: number;
  lendable_gpus: number; lent_gpus: number; borrowing_limit_gpus: number | null; lending_limit_gpus: number | null;
  weight: number; fair_share: number; fair_share_key: number; pending_jobs: number; running_jobs: number;
}
export interface QueueSeries {
  name: string; at_ms: number[]; used_gpus: number[]; nominal_gpus: number[]; borrowed_gpus: number[];
  lent_gpus: number[]; fair_share: number[]; fair_share_key: number[]; pending_jobs: number[];
}
export interface QueueHistory { interval_ms: number; keep_ms: number; queues: QueueSeries[] }
export interface JobRow {
  name: string; queue: string; pods: number; gpus_per_pod: number; priority: number;
  submitted_s: number; submitted_ms: number; state: string; queue_position: number | null; estimate?: Estimate | null;
}
/** When a pending job is expected to start (ms since the epoch), from the planner. */
export interface Estimate { p10_ms: number; p50_ms: number; p90_ms: number; reservation: string | null; text: string }
export interface WhatIfOutcome {
  change: string; job: { queue: string; pods: number; gpus_per_pod: number; gpu_type: string };
  estimate: Estimate | null; nodes: string | null; text: string;
}
export interface WhatIfAnswer { at_ms: number; jobs_ahead: number; answer: WhatIfOutcome; variations: WhatIfOutcome[] }
export interface PolicyRef { name: string; version: string; role: string; weight: number; sha256: string }
export interface Explanation {
  job: string; queue: string; pods: number; gpus_per_pod: number; priority: number; time_s: number;
  outcome: { kind: "placed"; nodes: [string, number][] } | { kind: "pending"; waiting_for: string };
  quota: { builtin: { verdict: string; gpus?: number; reason?: string }; policies: [string, string][]; fair_share_key: number; position: number };
  nodes_total: number; nodes_evaluated: number; nodes_feasible: number;
  filters: { policy: string; rejected: [string, number][] }[];
  // reasons: `[policy, text]` from score policies of contract 0.2.0; absent when none.
  top_nodes: { node: string; total: number; parts: [string, number][]; reasons?: [string, string][] }[];
  domain: string | null; policy_set: number; policies: PolicyRef[]; preempted: string[]; faults: string[];
}
export interface DecisionRecord { time_ms: number; seq: number; explanation: Explanation }
export interface Explain {
  name: string; kind: string; job: string; state: string; queue_position: number | null;
  queue_name: string; pods: number; gpus_per_pod: number; priority: number;
  queue: Queue | null; why: string; waiting_for: string | null; latest: DecisionRecord | null; attempts: number;
  estimate?: Estimate | null; history: JobEvent[];
}
/** One step of a job's life: placed, preempted (by whom) or pending. */
export interface JobEvent { time_ms: number; kind: "placed" | "preempted" | "pending"; text: string; by: string | null }
export interface DecisionEvent {
  time_ms: number; job: string; queue: string; placed: boolean; pods: number; gpus_per_pod: number;
  nodes: string[]; domain: string | null; policy_set: number; summary: string;
}
export interface Manifest {
  sha256: string; name: string; role: string; version: string; config: string; size: number;
  uploaded_by: string; uploaded_at_ms: number;
}
export interface SetEntry { sha256: string; weight: number; failure?: string; config: string; deadline_ms?: number | null }
export interface PolicySet { version: number; entries: SetEntry[]; created_by: string; created_at_ms: number; note: string }
export interface Validation { name: string; version: string; role: string; sha256: string; size: number; reasons: [number, string][]; self_test: string }
export interface ShadowReport {
  candidate_version: number; started_ms: number; started_by: string; cycles: number;
  decisions_compared: number; counts: Record<string, number>;
  recent: { time_ms: number; job: string; kind: string; active_set: number; active: Explanation; candidate: Explanation }[];
}
export interface AuditEntry { id: number; at_ms: number; who: string; from: string; action: string; detail: string }
