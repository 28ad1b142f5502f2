// Quota, usage, borrowing and lending per queue; each queue's history over the last hour, as
// the server samples it (GET /api/queues/history, then only what is new every few seconds);
// and the pending jobs of one queue, in their order.
import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import { get, message, type JobRow, type Queue, type QueueHistory, type QueueSeries } from "../api";
import { Status, time } from "../ui";

const COLORS = ["#0b5cad", "#c1121f", "#2a9d8f", "#6a4c93", "#e76f51", "#264653", "#8d6e00", "#1b998b"];

type Metric = "fair_share_key" | "used_gpus" | "lent_gpus" | "borrowed_gpus" | "pending_jobs";
const METRICS: [Metric, string][] = [
  ["fair_share_key", "fair-share key (lower goes first)"],
  ["used_gpus", "GPUs in use"],
  ["lent_gpus", "GPUs lent to other queues"],
  ["borrowed_gpus", "GPUs borrowed beyond quota"],
  ["pending_jobs", "pending jobs"],
];

/** Appends `fresh` samples to `old`, per queue, dropping those older than `keepMs`. */
function merge(old: Map<string, QueueSeries>, fresh: QueueHistory): Map<string, QueueSeries> {
  const out = new Map(old);
  for (const q of fresh.queues) {
    const have = out.get(q.name);
    const cols = Object.keys(q).filter((k) => k !== "name") as (keyof Omit<QueueSeries, "name">)[];
    const merged: QueueSeries = have ? { ...have } : { ...q };
    if (have) for (const k of cols) merged[k] = [...have[k], ...q[k]];
    const oldest = (merged.at_ms.at(-1) ?? 0) - fresh.keep_ms;
    const drop = merged.at_ms.findIndex((t) => t >= oldest);
    if (drop > 0) for (const k of cols) merged[k] = merged[k].slice(drop);
    out.set(q.name, merged);
  }
  return out;
}

/** One time axis (seconds) for uPlot, with each queue's values aligned to it. */
function aligned(series: Map<string, QueueSeries>, metric: Metric): [string[], uPlot.AlignedData] {
  const names = [...series.keys()];
  const times = [...new Set(names.flatMap((n) => series.get(n)!.at_ms))].sort((a, b) => a - b);
  const at = new Map(times.map((t, i) => [t, i]));
  const columns = names.map((n) => {
    const s = series.get(n)!;
    const col: (number | null)[] = new Array(times.length).fill(null);
    s.at_ms.forEach((t, i) => { col[at.get(t)!] = s[metric][i]; });
    return col;
  });
  return [names, [times.map((t) => t / 1000), ...columns] as uPlot.AlignedData];
}

export function QueuesPage() {
  const [queues, setQueues] = useState<Queue[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [chosen, setChosen] = useState("");
  const [history, setHistory] = useState<Map<string, QueueSeries>>(new Map());
  const [metric, setMetric] = useState<Metric>("fair_share_key");

  // The table: the queues now, every 2 s.
  useEffect(() => {
    let stop = false, timer = 0;
    const poll = async () => {
      try {
        const q = await get<Queue[]>("/api/queues");
        if (stop) return;
        setQueues(q);
        setError(null);
      } catch (e) {
        if (!stop) setError(message(e));
      }
      if (!stop) timer = window.setTimeout(poll, 2000);
    };
    poll();
    return () => { stop = true; clearTimeout(timer); };
  }, []);

  // The chart's data: the server's last hour once, then only the samples newer than the last.
  useEffect(() => {
    let stop = false, timer = 0, since = 0, every = 5000;
    const poll = async () => {
      try {
        const h = await get<QueueHistory>(`/api/queues/history?since=${since}`);
        if (stop) return;
        every = h.interval_ms || every;
        for (const q of h.queues) since = Math.max(since, q.at_ms.at(-1) ?? 0);
        if (h.queues.some((q) => q.at_ms.length)) setHistory((old) => merge(old, h));
      } catch (e) {
        if (!stop) setError(message(e));
      }
      if (!stop) timer = window.setTimeout(poll, Math.min(every, 5000));
    };
    poll();
    return () => { stop = true; clearTimeout(timer); };
  }, []);

  const samples = Math.max(0, ...[...history.values()].map((s) => s.at_ms.length));
  const times = [...history.values()].flatMap((s) => [s.at_ms[0], s.at_ms.at(-1)]).filter((t): t is number => t !== undefined);

  return (
    <>
      <h1>Queues</h1>
      <Status error={error} />
      <table aria-label="Queues">
        <caption class="hint">GPUs per queue. Borrowed: used beyond its quota, lent by other queues. Lent: of its quota, what other queues
          use now by borrowing it. Idle: unused quota others may borrow, within the lending limit. Job counts are work only:
          balloons, which hold idle GPUs and give way to work, are counted in their own column.</caption>
        <thead><tr><th>queue</th><th>parent</th><th class="num">quota</th><th class="num">used</th><th class="num">borrowed</th>
          <th class="num">lent</th><th class="num">idle, lendable</th><th class="num">borrow limit</th><th class="num">weight</th>
          <th class="num">fair share</th><th class="num">pending jobs</th><th class="num">running jobs</th>
          <th class="num">balloons (pending / holding)</th></tr></thead>
        <tbody>
          {queues.map((q) => (
            <tr data-queue={q.name}>
              <td><button type="button" onClick={() => setChosen(q.name)} aria-label={`Show pending jobs of ${q.name}`}>{q.name}</button></td>
              <td>{q.parent ?? "—"}</td><td class="num">{q.nominal_gpus}</td><td class="num">{q.used_gpus}</td>
              <td class="num">{q.borrowed_gpus}</td><td class="num" data-col="lent">{q.lent_gpus}</td><td class="num">{q.lendable_gpus}</td>
              <td class="num">{q.borrowing_limit_gpus ?? "none"}</td>
              <td class="num">{q.weight}</td><td class="num">{q.fair_share.toFixed(3)}</td>
              <td class="num">{q.pending_jobs}</td><td class="num">{q.running_jobs}</td>
              <td class="num" data-col="balloons">{q.balloon_pending_jobs} / {q.balloon_running_jobs}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>Over time</h2>
      <div class="row">
        <label for="q-metric">Show</label>
        <select id="q-metric" value={metric} onChange={(e) => setMetric((e.target as HTMLSelectElement).value as Metric)}>
          {METRICS.map(([m, label]) => <option value={m}>{label}</option>)}
        </select>
      </div>
      <p class="hint" data-testid="history-summary" data-samples={samples}>
        {samples
          ? `${samples} samples per queue, taken by the server every 5 s, from ${time(Math.min(...times))} to ${time(Math.max(...times))}; the last hour is kept.`
          : "The server samples every queue every 5 s; the first samples are on their way."}
      </p>
      <Chart history={history} metric={metric} />
      {chosen && <Pending queue={chosen} />}
    </>
  );
}

function Chart({ history, metric }: { history: Map<string, QueueSeries>; metric: Metric }) {
  const el = useRef<HTMLDivElement>(null);
  const chart = useRef<{ plot: uPlot; key: string } | null>(null);
  const label = METRICS.find(([m]) => m === metric)![1];
  useEffect(() => {
    if (!el.current || history.size === 0) return;
    const [names, data] = aligned(history, metric);
    // A new metric or a new set of queues needs new series; otherwise only the data changes.
    const key = `${metric}|${names.join(",")}`;
    if (chart.current?.key !== key) {
      chart.current?.plot.destroy();
      chart.current = {
        key,
        plot: new uPlot({
          width: Math.min(900, el.current.clientWidth || 900), height: 260,
          series: [{}, ...names.map((n, i) => ({ label: n, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true }))],
          axes: [{}, { label, size: 70 }],
        }, data, el.current),
      };
    } else chart.current.plot.setData(data);
  }, [history, metric]);
  useEffect(() => () => { chart.current?.plot.destroy(); chart.current = null; }, []);
  return <div ref={el} class="chart" role="img" aria-label={`Line chart of each queue's ${label} over the last hour`} />;
}

function Pending({ queue }: { queue: string }) {
  const [jobs, setJobs] = useState<JobRow[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    setJobs(null);
    get<JobRow[]>(`/api/jobs?state=pending&limit=200&queue=${encodeURIComponent(queue)}`).then(setJobs).catch((e) => setError(message(e)));
  }, [queue]);
  return (
    <section aria-labelledby="pending-title">
      <h2 id="pending-title">Pending jobs of {queue}</h2>
      <Status error={error} />
      {jobs && (jobs.length === 0 ? <p>No job of {queue} is pending.</p> : (
        <table>
          <thead><tr><th class="num">position</th><th>job</th><th class="num">pods × GPUs</th><th class="num">priority</th></tr></thead>
          <tbody>{jobs.map((j) => (
            <tr><td class="num">{j.queue_position ?? "—"}</td><td><a href={`#/jobs?name=${encodeURIComponent(j.name)}`}>{j.name}</a></td>
              <td class="num">{j.pods} × {j.gpus_per_pod}</td><td class="num">{j.priority}</td></tr>
          ))}</tbody>
        </table>
      ))}
    </section>
  );
}
