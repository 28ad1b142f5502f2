// Search, then one job or pod: why it is pending (in words), its attempts, the nodes each policy
// rejected and why, the top nodes' score breakdown, the quota verdict, domain and policy versions;
// for a pending job, when the planner expects it to start, and what would start it sooner.
import { useEffect, useState } from "preact/hooks";
import {
  get, message, post, type BadNode, type DecisionRecord, type Estimate, type Explain, type Explanation, type JobRow, type Queue, type WhatIfAnswer, type WhatIfJob,
} from "../api";
import { Ago, Status, dateTime, duration, time, short } from "../ui";

export function JobsPage({ name }: { name: string }) {
  const [q, setQ] = useState(name);
  const [queue, setQueue] = useState("");
  const [namespace, setNamespace] = useState("");
  const [sort, setSort] = useState<"position" | "wait">("position");
  const [restarted, setRestarted] = useState(false);
  const [queues, setQueues] = useState<string[]>([]);
  const [rows, setRows] = useState<JobRow[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  // The page opens on the pending jobs: what a researcher came to see, without typing.
  const load = async (e?: Event) => {
    e?.preventDefault();
    setError(null);
    const params = new URLSearchParams({ limit: "100", sort });
    // Restarted jobs are pending or running again: both, when asked for them alone.
    if (q.trim()) params.set("q", q.trim()); else if (!restarted) params.set("state", "pending");
    if (restarted) params.set("restarted", "true");
    if (queue) params.set("queue", queue);
    if (namespace.trim()) params.set("namespace", namespace.trim());
    try { setRows(await get<JobRow[]>(`/api/jobs?${params}`)); } catch (err) { setError(message(err)); }
  };
  useEffect(() => { setQ(name); }, [name]);
  useEffect(() => { void load(); }, [queue, sort, restarted]);
  useEffect(() => {
    get<Queue[]>("/api/queues").then((all) => setQueues(all.map((x) => x.name).sort())).catch(() => setQueues([]));
  }, []);
  const now = Date.now();
  return (
    <>
      <h1>Jobs and pods</h1>
      <form class="row" role="search" onSubmit={load}>
        <label for="job-q">Job or pod name</label>
        <input id="job-q" value={q} onInput={(e) => setQ((e.target as HTMLInputElement).value)} placeholder="empty: every pending job" />
        <label for="job-queue">Queue</label>
        <select id="job-queue" value={queue} onChange={(e) => setQueue((e.target as HTMLSelectElement).value)}>
          <option value="">all</option>
          {queues.map((x) => <option value={x}>{x}</option>)}
        </select>
        <label for="job-ns">Namespace</label>
        <input id="job-ns" value={namespace} size={12} onInput={(e) => setNamespace((e.target as HTMLInputElement).value)} placeholder="all" />
        <label for="job-sort">Sort by</label>
        <select id="job-sort" value={sort} onChange={(e) => setSort((e.target as HTMLSelectElement).value as "position" | "wait")}>
          <option value="position">queue position</option>
          <option value="wait">longest wait</option>
        </select>
        <label><input type="checkbox" checked={restarted} onChange={(e) => setRestarted((e.target as HTMLInputElement).checked)} /> Only jobs a node failure restarted</label>
        <button type="submit" class="primary">Search</button>
        <button type="button" onClick={() => { location.hash = `#/jobs?name=${encodeURIComponent(q.trim())}`; }}>Explain this name</button>
      </form>
      <Status error={error} />
      <WhatIfForm queues={queues} />
      {rows && (rows.length === 0 ? <p>No pending or running job matches. A finished job can still be explained by its exact name.</p> : (
        <table aria-label="Matching jobs">
          <thead><tr><th>job</th><th>queue</th><th>state</th><th class="num">position</th><th class="num">waiting</th><th class="num">pods × GPUs</th><th>expected start</th></tr></thead>
          <tbody>{rows.map((r) => (
            <tr><td><a href={`#/jobs?name=${encodeURIComponent(r.name)}`}>{r.name}</a>
              {r.avoiding.length > 0 && <> <span class="badge warn" title={r.avoiding.map((b) => `${b.node} reported ${b.cause}`).join("; ")}>restarted</span></>}</td>
              <td>{r.queue}</td><td>{r.state}</td>
              <td class="num">{r.queue_position ?? "—"}</td>
              <td class="num">{r.state === "pending" ? duration(now - r.submitted_ms) : "—"}</td>
              <td class="num">{r.pods} × {r.gpus_per_pod}</td>
              <td data-col="start" title={r.estimate ? `about ${time(r.estimate.p50_ms)}, 90% by ${time(r.estimate.p90_ms)}` : undefined}>
                {r.estimate ? r.estimate.short : r.no_estimate ? <span class="hint">no estimate: {r.no_estimate}</span> : "—"}</td></tr>
          ))}</tbody>
        </table>
      ))}
      {name && <Detail name={name} />}
    </>
  );
}

function Detail({ name }: { name: string }) {
  const [ex, setEx] = useState<Explain | null>(null);
  const [history, setHistory] = useState<DecisionRecord[]>([]);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    setEx(null); setError(null); setHistory([]);
    (async () => {
      try {
        const e = await get<Explain>(`/api/explain/${encodeURIComponent(name)}`);
        setEx(e);
        if (e.attempts > 0) setHistory(await get<DecisionRecord[]>(`/api/decisions/job/${encodeURIComponent(e.job)}?limit=50`));
      } catch (err) { setError(message(err)); }
    })();
  }, [name]);
  if (error) return <Status error={error} />;
  if (!ex) return <p>Loading {name}…</p>;
  const x = ex.latest?.explanation;
  return (
    <section aria-labelledby="detail-title">
      <h2 id="detail-title">{ex.kind} {ex.name}{ex.kind === "pod" ? ` (job ${ex.job})` : ""}: {ex.state}</h2>
      <div class="card">
        <h3>{ex.state === "pending" ? "Why pending now" : "What happened"}</h3>
        <p class="why" data-testid="why">{ex.why}</p>
        {ex.waiting_for && <p class="why"><strong>Waiting for:</strong> <span data-testid="waiting-for">{ex.waiting_for}</span></p>}
        <p>
          {ex.pods} pods × {ex.gpus_per_pod} GPUs, queue {ex.queue_name}, priority {ex.priority}
          {ex.queue_position != null && <>; position {ex.queue_position} in its queue</>}.
          {ex.queue && <> Queue {ex.queue.name}: {ex.queue.used_gpus} of {ex.queue.nominal_gpus} GPUs used ({ex.queue.borrowed_gpus} borrowed), fair share {ex.queue.fair_share.toFixed(3)}.</>}
        </p>
      </div>
      {ex.avoiding.length > 0 && <RestartCard avoiding={ex.avoiding} />}
      {ex.history.length > 0 && (
        <div class="card">
          <h3>History</h3>
          <ol class="history" aria-label="Job history" data-testid="job-history">
            {ex.history.map((h) => <li data-kind={h.kind}><time>{time(h.time_ms)}</time> {h.text}</li>)}
          </ol>
        </div>
      )}
      {ex.state === "pending" && <StartCard job={ex.job} estimate={ex.estimate ?? null} noEstimate={ex.no_estimate ?? null} />}
      {x ? <Breakdown x={x} verdict={ex.quota_verdict ?? null} /> : <p>No attempt yet, so no nodes were evaluated.</p>}
      <h3>Attempts ({ex.attempts} on record)</h3>
      <table>
        <thead><tr><th>time</th><th>outcome</th><th>domain</th><th class="num">feasible / evaluated</th><th class="num">set</th></tr></thead>
        <tbody>{history.slice().reverse().map((r) => {
          const e = r.explanation;
          return (
            <tr><td>{time(r.time_ms)}</td>
              <td>{e.outcome.kind === "placed" ? `placed on ${e.outcome.nodes.map(([n, k]) => (k > 1 ? `${n}×${k}` : n)).join(", ")}` : `pending: ${e.outcome.waiting_for}`}</td>
              <td>{e.domain ?? "—"}</td><td class="num">{e.nodes_feasible} / {e.nodes_evaluated}</td><td class="num">v{e.policy_set}</td></tr>
          );
        })}</tbody>
      </table>
    </section>
  );
}

/** Why a node failure restarted the job, and how long it stays off each failed node: durations
 * to read, clock times on hover. */
function RestartCard({ avoiding }: { avoiding: BadNode[] }) {
  const now = Date.now();
  return (
    <div class="card restart" data-testid="restart">
      <h3>Restarted after a node failure</h3>
      {avoiding.map((b) => (
        <p class="why" data-node={b.node}>
          Restarted after {b.node} reported {b.cause} <Ago ms={b.at_ms} now={now} />;{" "}
          {b.until_ms > now
            ? <>avoiding {b.node} for <time dateTime={new Date(b.until_ms).toISOString()} title={`until ${dateTime(b.until_ms)}`}>{duration(b.until_ms - now)}</time> more.</>
            : <>it may use {b.node} again since <time dateTime={new Date(b.until_ms).toISOString()} title={dateTime(b.until_ms)}>{time(b.until_ms)}</time>.</>}
        </p>
      ))}
    </div>
  );
}

/** The planner's estimate with a small timeline, and the what-if variations on request. */
function StartCard({ job, estimate, noEstimate }: { job: string; estimate: Estimate | null; noEstimate: string | null }) {
  const [answer, setAnswer] = useState<WhatIfAnswer | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  useEffect(() => { setAnswer(null); setError(null); }, [job]);
  const ask = async () => {
    setBusy(true); setError(null);
    try { setAnswer(await post<WhatIfAnswer, WhatIfJob>("/api/whatif", { like: job, variations: true })); }
    catch (err) { setError(message(err)); }
    finally { setBusy(false); }
  };
  const outcomes = answer ? [answer.answer, ...answer.variations] : [];
  return (
    <div class="card">
      <h3>When it will start</h3>
      {estimate ? (
        <>
          <p class="why" data-testid="estimate">{estimate.text.charAt(0).toUpperCase() + estimate.text.slice(1)}.</p>
          <Timeline e={estimate} />
        </>
      ) : <p class="why" data-testid="no-estimate">{noEstimate ? `No start estimate: ${noEstimate}.` : "No start estimate yet."}</p>}
      <button type="button" onClick={ask} disabled={busy}>{busy ? "Asking the plan…" : "Start sooner with…"}</button>
      <Status error={error} />
      {answer && <WhatIfTable label="What-if variations" answer={answer} outcomes={outcomes} />}
    </div>
  );
}

type Outcome = WhatIfAnswer["answer"];
/** An answer's start as a clock time (ms): its p50, or, beyond the forecast, the earliest it
 * could start. The page reads durations; the clock time is for hover and for tests. */
const startOrBound = (o: Outcome) => o.estimate?.p50_ms ?? o.not_before_ms ?? undefined;
const startTitle = (o: Outcome) =>
  o.estimate ? `about ${time(o.estimate.p50_ms)}` : o.not_before_ms ? `not before ${time(o.not_before_ms)}` : undefined;

/** A what-if's answers: the shape asked about, then any variations. */
function WhatIfTable({ label, answer, outcomes }: { label: string; answer: WhatIfAnswer; outcomes: WhatIfAnswer["variations"] }) {
  return (
    <table aria-label={label}>
      <caption>From the same plan, {answer.jobs_ahead} pending jobs ahead; soonest first after the job as submitted.</caption>
      <thead><tr><th>change</th><th>shape</th><th>expected start</th><th>answer</th></tr></thead>
      <tbody>{outcomes.map((o) => (
        <tr><td>{o.change || "as submitted"}</td>
          <td>{o.job.pods} × {o.job.gpus_per_pod} {o.job.gpu_type || "any GPU"}, queue {o.job.queue}</td>
          <td title={startTitle(o)}>{o.estimate ? o.estimate.short : o.not_before_ms ? "later" : "—"}</td><td>{o.text}</td></tr>
      ))}</tbody>
    </table>
  );
}

/** "If I submitted 16 × 8 GPUs to rl, when would it start?": the same forecast as a pending
 * job's, for a shape not submitted, answered as a duration from now. */
function WhatIfForm({ queues }: { queues: string[] }) {
  const [queue, setQueue] = useState("");
  const [pods, setPods] = useState(1);
  const [gpus, setGpus] = useState(8);
  const [gpuType, setGpuType] = useState("");
  const [answer, setAnswer] = useState<WhatIfAnswer | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const ask = async (e: Event) => {
    e.preventDefault();
    setBusy(true); setError(null);
    const job: WhatIfJob = { queue: queue || queues[0], pods, gpus_per_pod: gpus, variations: false };
    if (gpuType.trim()) job.gpu_type = gpuType.trim();
    try { setAnswer(await post<WhatIfAnswer, WhatIfJob>("/api/whatif", job)); }
    catch (err) { setAnswer(null); setError(message(err)); }
    finally { setBusy(false); }
  };
  const num = (set: (n: number) => void) => (e: Event) => set(Math.max(1, Math.floor(Number((e.target as HTMLInputElement).value) || 1)));
  return (
    <details class="card" data-testid="whatif-form">
      <summary>If I submitted…</summary>
      <form class="row" onSubmit={ask}>
        <label for="wi-queue">Queue</label>
        <select id="wi-queue" value={queue || queues[0] || ""} onChange={(e) => setQueue((e.target as HTMLSelectElement).value)}>
          {queues.map((x) => <option value={x}>{x}</option>)}
        </select>
        <label for="wi-pods">Pods</label>
        <input id="wi-pods" type="number" min={1} value={pods} size={4} onInput={num(setPods)} />
        <label for="wi-gpus">GPUs per pod</label>
        <input id="wi-gpus" type="number" min={1} value={gpus} size={3} onInput={num(setGpus)} />
        <label for="wi-type">GPU type</label>
        <input id="wi-type" value={gpuType} size={14} onInput={(e) => setGpuType((e.target as HTMLInputElement).value)} placeholder="any" />
        <button type="submit" class="primary" disabled={busy || !queues.length}>{busy ? "Asking the plan…" : "When would it start?"}</button>
      </form>
      <Status error={error} />
      {answer && (
        <>
          <p class="why" data-testid="whatif-answer" data-start-ms={startOrBound(answer.answer)} title={startTitle(answer.answer)}>{answer.answer.estimate ? `It would start ${answer.answer.estimate.short}.` : ""} {answer.answer.text}</p>
          <WhatIfTable label="What-if answer" answer={answer} outcomes={[answer.answer]} />
        </>
      )}
    </details>
  );
}

/** Now → p10 … p50 … p90 on one axis: the band is the 10–90% interval, the mark the median. */
function Timeline({ e }: { e: Estimate }) {
  const now = Date.now();
  const end = Math.max(e.p90_ms, now + 60_000);
  const span = (end - now) * 1.1;
  const x = (ms: number) => 10 + (380 * Math.max(0, ms - now)) / span;
  const label = `Start expected between ${time(e.p10_ms)} and ${time(e.p90_ms)}, most likely about ${time(e.p50_ms)}`;
  return (
    <svg class="timeline" viewBox="0 0 400 46" role="img" aria-label={label} data-testid="start-timeline">
      <line x1="10" y1="18" x2="390" y2="18" stroke="#555" />
      <rect x={x(e.p10_ms)} y="10" width={Math.max(2, x(e.p90_ms) - x(e.p10_ms))} height="16" fill="#9cc3e6" />
      <line x1={x(e.p50_ms)} y1="6" x2={x(e.p50_ms)} y2="30" stroke="#123f6b" stroke-width="3" />
      <text x="10" y="42" font-size="11" fill="#222">now</text>
      <text x={Math.min(Math.max(x(e.p50_ms), 44), 330)} y="42" font-size="11" fill="#222">{time(e.p50_ms)}</text>
    </svg>
  );
}

/** The latest decision's breakdown; `verdict` is its quota in words, as the server words it
 * (`quota_verdict`, the same sentence `gantry explain` prints). */
export function Breakdown({ x, verdict }: { x: Explanation; verdict: string | null }) {
  return (
    <div class="card">
      <h3>Latest decision (policy set v{x.policy_set})</h3>
      <p><strong>Quota:</strong> {verdict ?? "—"}. <strong>Topology domain:</strong> {x.domain ?? "none chosen"}.</p>
      <p><strong>Policies:</strong> {x.policies.map((p) => `${p.name} ${p.version} (${p.role}, weight ${p.weight}, ${short(p.sha256)})`).join("; ") || "built-ins only"}</p>
      <p>{x.nodes_feasible} of {x.nodes_evaluated} evaluated nodes (of {x.nodes_total}) passed every filter.</p>
      <h4>Nodes rejected, per policy and reason</h4>
      {x.filters.some((f) => f.rejected.length) ? (
        <table>
          <thead><tr><th>policy</th><th>reason</th><th class="num">nodes</th></tr></thead>
          <tbody>{x.filters.flatMap((f) => f.rejected.map(([reason, n]) => <tr><td>{f.policy}</td><td>{reason}</td><td class="num">{n}</td></tr>))}</tbody>
        </table>
      ) : <p>No node was rejected.</p>}
      <h4>Top nodes by score</h4>
      {x.top_nodes.length ? (
        <table>
          <thead><tr><th>node</th><th class="num">total</th><th>parts</th></tr></thead>
          <tbody>{x.top_nodes.map((n) => <tr><td>{n.node}</td><td class="num">{n.total}</td><td>{n.parts.map(([p, s]) => `${p} ${s}`).join(", ")}{(n.reasons ?? []).map(([p, r]) => <div class="hint">{p}: {r}</div>)}</td></tr>)}</tbody>
        </table>
      ) : <p>No node was scored.</p>}
      {x.faults.length > 0 && <p class="error">Policy faults: {x.faults.join("; ")}</p>}
    </div>
  );
}
