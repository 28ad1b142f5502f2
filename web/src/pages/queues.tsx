// Quota, usage, borrowing and lending per queue; fair share over time (sampled while the page is
// open); and the pending jobs of one queue, in their order.
import { useEffect, useRef, useState } from "preact/hooks";
import uPlot from "uplot";
import { get, message, type JobRow, type Queue } from "../api";
import { Status } from "../ui";

const COLORS = ["#0b5cad", "#c1121f", "#2a9d8f", "#6a4c93", "#e76f51", "#264653", "#8d6e00", "#1b998b"];

export function QueuesPage() {
  const [queues, setQueues] = useState<Queue[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [chosen, setChosen] = useState("");
  const history = useRef<{ t: number[]; s: Map<string, number[]> }>({ t: [], s: new Map() });
  const chartEl = useRef<HTMLDivElement>(null);
  const chart = useRef<uPlot | null>(null);

  useEffect(() => {
    let stop = false, timer = 0;
    const poll = async () => {
      try {
        const q = await get<Queue[]>("/api/queues");
        if (stop) return;
        setQueues(q);
        setError(null);
        const h = history.current;
        h.t.push(Date.now() / 1000);
        for (const queue of q) {
          const s = h.s.get(queue.name) ?? new Array(h.t.length - 1).fill(null);
          s.push(queue.fair_share_key);
          h.s.set(queue.name, s);
        }
        if (h.t.length > 600) { h.t.shift(); h.s.forEach((s) => s.shift()); }
        const names = [...h.s.keys()];
        const data = [h.t, ...names.map((n) => h.s.get(n)!)] as uPlot.AlignedData;
        if (!chart.current && chartEl.current) {
          chart.current = new uPlot({
            width: Math.min(900, chartEl.current.clientWidth || 900), height: 260,
            series: [{}, ...names.map((n, i) => ({ label: n, stroke: COLORS[i % COLORS.length], width: 2 }))],
            axes: [{}, { label: "fair-share key (lower goes first)" }],
          }, data, chartEl.current);
        } else chart.current?.setData(data);
      } catch (e) {
        if (!stop) setError(message(e));
      }
      if (!stop) timer = window.setTimeout(poll, 2000);
    };
    poll();
    return () => { stop = true; clearTimeout(timer); chart.current?.destroy(); chart.current = null; };
  }, []);

  return (
    <>
      <h1>Queues</h1>
      <Status error={error} />
      <table>
        <caption class="hint">GPUs per queue. Borrowed: used beyond the quota, lent by siblings. Lendable: idle quota others may borrow.</caption>
        <thead><tr><th>queue</th><th>parent</th><th class="num">quota</th><th class="num">used</th><th class="num">borrowed</th>
          <th class="num">lendable</th><th class="num">borrow limit</th><th class="num">weight</th><th class="num">fair share</th>
          <th class="num">pending jobs</th><th class="num">running jobs</th></tr></thead>
        <tbody>
          {queues.map((q) => (
            <tr>
              <td><button type="button" onClick={() => setChosen(q.name)} aria-label={`Show pending jobs of ${q.name}`}>{q.name}</button></td>
              <td>{q.parent ?? "—"}</td><td class="num">{q.nominal_gpus}</td><td class="num">{q.used_gpus}</td>
              <td class="num">{q.borrowed_gpus}</td><td class="num">{q.lendable_gpus}</td><td class="num">{q.borrowing_limit_gpus ?? "none"}</td>
              <td class="num">{q.weight}</td><td class="num">{q.fair_share.toFixed(3)}</td>
              <td class="num">{q.pending_jobs}</td><td class="num">{q.running_jobs}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>Fair share over time</h2>
      <p class="hint">Each queue's fair-share key, sampled every 2 s while this page is open.</p>
      <div ref={chartEl} role="img" aria-label="Line chart of each queue's fair-share key over time" />
      {chosen && <Pending queue={chosen} />}
    </>
  );
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
