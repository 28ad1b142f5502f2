// The GPU occupancy heatmap along the topology: one panel per block, one column per rack, one
// cell per node. A Ready node is shaded by the GPUs its work uses; any other node by its
// health-lifecycle state (Preflight, Suspect, Draining, Repair, Re-test, Retired), so a failure
// and its repair are seen where they happen, with a legend that counts each. Drawn on a canvas
// (7,500 DOM cells would not update at 1 Hz smoothly), with positions computed once per topology
// and colours redrawn on every poll. Keyboard users move a
// focus cell with the arrow keys (a box drawn over the canvas, so moving it redraws nothing),
// hear the focused node named through a live region, and open it with Enter.
import { useEffect, useMemo, useRef, useState } from "preact/hooks";
import { get, message, type NodeColumns, type NodeDetail, type NodeHealth, type NodeState, type Queue } from "../api";
import { STATES, STATE_COLOR, STATE_NAME } from "../health";
import { Ago, Status, time } from "../ui";

const CELL = 6, GAP = 1, STEP = CELL + GAP, LABEL = 14, PANEL_GAP = 10, WIDTH = 980;
const PALETTE = ["#f1f6fc", "#c6dbef", "#6baed6", "#2171b5", "#08306b"];
// A node the lifecycle has as Ready that Kubernetes reports not ready or cordoned (an admin's
// cordon, a kubelet gone): out of the lifecycle's hands, so shaded apart from its states.
const UNHEALTHY = "#5c677d", FILTERED = "#e4e4e4";
// A node whose GPUs in use are mostly balloons': idle capacity kept warm, not work, so it is not
// shaded as busy.
const BALLOON = "#f6d28b";

interface Layout { x: Int16Array; y: Int16Array; height: number; labels: [string, number, number][] }

/** Blocks → racks → nodes, from the node columns' topology levels (coarsest first). */
function layout(cols: NodeColumns): Layout {
  const n = cols.name.length;
  const levels = [...cols.levels].sort((a, b) => new Set(a[1]).size - new Set(b[1]).size);
  const outer = levels[0]?.[1] ?? new Array(n).fill(0);
  const inner = levels[1]?.[1] ?? outer;
  const outerName = levels[0]?.[0] ?? "cluster";
  const groups = new Map<number, Map<number, number[]>>();
  for (let i = 0; i < n; i++) {
    let g = groups.get(outer[i]);
    if (!g) groups.set(outer[i], (g = new Map()));
    let r = g.get(inner[i]);
    if (!r) g.set(inner[i], (r = []));
    r.push(i);
  }
  const x = new Int16Array(n), y = new Int16Array(n);
  const labels: [string, number, number][] = [];
  let px = 0, py = 0, rowH = 0;
  for (const b of [...groups.keys()].sort((a, c) => a - c)) {
    const racks = groups.get(b)!;
    const w = racks.size * STEP, h = LABEL + Math.max(...[...racks.values()].map((r) => r.length)) * STEP;
    if (px > 0 && px + w > WIDTH) { px = 0; py += rowH + PANEL_GAP; rowH = 0; }
    labels.push([`${outerName} ${b}`, px, py + 11]);
    let c = 0;
    for (const r of [...racks.keys()].sort((a, d) => a - d)) {
      racks.get(r)!.forEach((i, k) => { x[i] = px + c * STEP; y[i] = py + LABEL + k * STEP; });
      c++;
    }
    px += w + PANEL_GAP;
    rowH = Math.max(rowH, h);
  }
  return { x, y, height: py + rowH + 2, labels };
}

/** The node nearest to `i` in direction (dx, dy) on the drawn layout: straight on first, then
 * the closest off the line; `i` itself when there is none. One pass over the nodes per key. */
function neighbour(lay: Layout, i: number, dx: number, dy: number): number {
  let best = i, bestScore = Infinity;
  const x0 = lay.x[i], y0 = lay.y[i];
  for (let j = 0; j < lay.x.length; j++) {
    const ex = lay.x[j] - x0, ey = lay.y[j] - y0;
    const along = dx ? ex * dx : ey * dy;
    if (along <= 0) continue;
    const score = along + 4 * Math.abs(dx ? ey : ex);
    if (score < bestScore) { bestScore = score; best = j; }
  }
  return best;
}

/** The focused node in words, for the live region. */
function describe(cols: NodeColumns, i: number): string {
  const used = cols.gpu_total[i] - cols.gpu_free[i];
  const held = cols.balloon_gpus[i] ? ` (${cols.balloon_gpus[i]} by balloons)` : "";
  const where = cols.levels.map(([level, domain]) => `${level} ${domain[i]}`).join(", ");
  const queues = cols.queues[i] ? `; queues ${cols.queues[i].split(",").join(", ")}` : "";
  return `Node ${cols.name[i]}: ${used} of ${cols.gpu_total[i]} GPUs in use${held}, ${STATE_NAME[cols.state[i]] ?? cols.state[i]}, ${cols.health[i]}, ${where}${queues}. Enter opens it.`;
}

export interface Filters { gpu: string; health: string; state: string; queue: string }

function passes(cols: NodeColumns, i: number, f: Filters) {
  if (f.gpu && cols.gpu_type[i] !== f.gpu) return false;
  if (f.health && cols.health[i] !== f.health) return false;
  if (f.state && cols.state[i] !== f.state) return false;
  if (f.queue && !cols.queues[i].split(",").includes(f.queue)) return false;
  return true;
}

function draw(canvas: HTMLCanvasElement, cols: NodeColumns, lay: Layout, f: Filters) {
  const ctx = canvas.getContext("2d", { alpha: false })!;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  ctx.fillStyle = "#222";
  ctx.font = "11px system-ui, sans-serif";
  for (const [text, lx, ly] of lay.labels) ctx.fillText(text, lx, ly);
  // One fillStyle per colour bucket: switching styles per cell is what costs on a canvas.
  const buckets: number[][] = PALETTE.map(() => []);
  const red: number[] = [], grey: number[] = [], balloon: number[] = [];
  const byState = new Map<NodeState, number[]>();
  for (let i = 0; i < cols.name.length; i++) {
    const state = cols.state[i];
    if (!passes(cols, i, f)) grey.push(i);
    else if (state !== "ready") {
      let idx = byState.get(state);
      if (!idx) byState.set(state, (idx = []));
      idx.push(i);
    } else if (cols.health[i] !== "healthy") red.push(i);
    else {
      const held = cols.balloon_gpus[i], work = cols.gpu_total[i] - cols.gpu_free[i] - held;
      if (held > work) { balloon.push(i); continue; }
      const used = cols.gpu_total[i] ? work / cols.gpu_total[i] : 0;
      buckets[Math.min(PALETTE.length - 1, Math.round(used * (PALETTE.length - 1)))].push(i);
    }
  }
  const paint = (color: string, idx: number[]) => {
    ctx.fillStyle = color;
    for (const i of idx) ctx.fillRect(lay.x[i], lay.y[i], CELL, CELL);
  };
  buckets.forEach((idx, b) => paint(PALETTE[b], idx));
  paint(BALLOON, balloon);
  paint(UNHEALTHY, red);
  for (const [state, idx] of byState) paint(STATE_COLOR[state] ?? UNHEALTHY, idx);
  paint(FILTERED, grey);
}


declare global {
  interface Window { __gantryCluster?: { updates: number[]; draws: number[] } }
}

export function ClusterPage() {
  const canvas = useRef<HTMLCanvasElement>(null);
  const [cols, setCols] = useState<NodeColumns | null>(null);
  const [queues, setQueues] = useState<Queue[]>([]);
  const [filters, setFilters] = useState<Filters>({ gpu: "", health: "", state: "", queue: "" });
  const [error, setError] = useState<string | null>(null);
  const [selected, setSelected] = useState<string | null>(null);
  const [focus, setFocus] = useState<number | null>(null);
  const [focused, setFocused] = useState(false);
  const lay = useMemo(() => (cols ? layout(cols) : null), [cols?.name.length, cols?.levels.length]);

  useEffect(() => {
    let stop = false, timer = 0;
    const perf: { updates: number[]; draws: number[] } = { updates: [], draws: [] };
    window.__gantryCluster = perf;
    const poll = async () => {
      const started = performance.now();
      try {
        const [c, q] = await Promise.all([get<NodeColumns>("/api/cluster/nodes"), get<Queue[]>("/api/queues")]);
        if (stop) return;
        setCols(c);
        setQueues(q);
        setError(null);
        perf.updates.push(performance.now());
      } catch (e) {
        if (!stop) setError(message(e));
      }
      // One update a second, counting the fetch itself.
      if (!stop) timer = window.setTimeout(poll, Math.max(0, 1000 - (performance.now() - started)));
    };
    poll();
    return () => { stop = true; clearTimeout(timer); };
  }, []);

  useEffect(() => {
    if (!cols || !lay || !canvas.current) return;
    const t = performance.now();
    draw(canvas.current, cols, lay, filters);
    window.__gantryCluster?.draws.push(performance.now() - t);
  }, [cols, lay, filters]);

  const gpuTypes = useMemo(() => [...new Set(cols?.gpu_type ?? [])].sort(), [cols]);
  const healths = useMemo(() => [...new Set(["healthy", ...(cols?.health ?? [])])].sort(), [cols]);
  const totals = useMemo(() => {
    if (!cols) return null;
    let total = 0, free = 0, shown = 0, other = 0;
    const states = new Map<string, number>();
    for (let i = 0; i < cols.name.length; i++) {
      total += cols.gpu_total[i]; free += cols.gpu_free[i];
      if (passes(cols, i, filters)) shown++;
      states.set(cols.state[i], (states.get(cols.state[i]) ?? 0) + 1);
      if (cols.state[i] === "ready" && cols.health[i] !== "healthy") other++;
    }
    return { total, free, shown, states, other };
  }, [cols, filters]);

  const onClick = (e: MouseEvent) => {
    if (!cols || !lay) return;
    const r = (e.target as HTMLCanvasElement).getBoundingClientRect();
    const mx = e.clientX - r.left, my = e.clientY - r.top;
    for (let i = 0; i < cols.name.length; i++) {
      if (mx >= lay.x[i] && mx < lay.x[i] + STEP && my >= lay.y[i] && my < lay.y[i] + STEP) {
        setSelected(cols.name[i]);
        setFocus(i);
        return;
      }
    }
  };
  const MOVES: Record<string, [number, number]> = { ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1] };
  const onKey = (e: KeyboardEvent) => {
    if (!cols || !lay || !cols.name.length) return;
    const at = focus !== null && focus < cols.name.length ? focus : 0;
    let next: number | null = null;
    if (e.key in MOVES) next = neighbour(lay, at, ...MOVES[e.key]);
    else if (e.key === "Home") next = 0;
    else if (e.key === "End") next = cols.name.length - 1;
    else if (e.key === "Enter" || e.key === " ") setSelected(cols.name[at]);
    else return;
    e.preventDefault();
    if (next !== null) setFocus(next);
  };
  const focusIndex = cols && focus !== null && focus < cols.name.length ? focus : null;
  // Worded when the focus moves, not on every poll: a live region re-announces each change.
  const spoken = useMemo(() => (cols && focusIndex !== null ? describe(cols, focusIndex) : null), [focusIndex, cols !== null]);
  const set = (k: keyof Filters) => (e: Event) => setFilters({ ...filters, [k]: (e.target as HTMLSelectElement).value });

  return (
    <>
      <h1>Cluster</h1>
      <Status error={error} />
      {totals && cols && (
        <p aria-live="off">
          {cols.name.length.toLocaleString()} nodes, {(totals.total - totals.free).toLocaleString()} of{" "}
          {totals.total.toLocaleString()} GPUs in use; {totals.shown.toLocaleString()} nodes match the filters. Updated {time(cols.at_ms)}.
        </p>
      )}
      <div class="row" role="group" aria-label="Filters">
        <label for="f-gpu">GPU type</label>
        <select id="f-gpu" value={filters.gpu} onChange={set("gpu")}>
          <option value="">all</option>
          {gpuTypes.map((g) => <option value={g}>{g}</option>)}
        </select>
        <label for="f-health">Health</label>
        <select id="f-health" value={filters.health} onChange={set("health")}>
          <option value="">all</option>
          {healths.map((h) => <option value={h}>{h}</option>)}
        </select>
        <label for="f-state">State</label>
        <select id="f-state" value={filters.state} onChange={set("state")}>
          <option value="">all</option>
          {STATES.map(([s, name]) => <option value={s}>{name}</option>)}
        </select>
        <label for="f-queue">Queue</label>
        <select id="f-queue" value={filters.queue} onChange={set("queue")}>
          <option value="">all</option>
          {queues.map((q) => <option value={q.name}>{q.name}</option>)}
        </select>
        <NodeLookup onOpen={setSelected} />
      </div>
      <div class="legend" aria-hidden="true">
        Ready nodes, GPUs in use by work: {PALETTE.map((c, i) => <span><span class="swatch" style={{ background: c }} />{Math.round((i / (PALETTE.length - 1)) * 100)}%</span>)}
        <span data-testid="balloon-shade"><span class="swatch" style={{ background: BALLOON }} />held mostly by balloons</span>
        <span><span class="swatch" style={{ background: FILTERED }} />filtered out</span>
      </div>
      <ul class="legend" aria-label="Nodes by health-lifecycle state" data-testid="state-legend">
        {STATES.map(([s, name, color]) => (
          <li data-state={s}>
            <span class="swatch" aria-hidden="true" style={{ background: s === "ready" ? PALETTE[2] : color }} />
            {name}{s === "ready" ? " (shaded by use)" : ""}: <span data-count>{(totals?.states.get(s) ?? 0).toLocaleString()}</span>
          </li>
        ))}
        <li data-state="other"><span class="swatch" aria-hidden="true" style={{ background: UNHEALTHY }} />Ready but not ready or cordoned in Kubernetes: <span data-count>{(totals?.other ?? 0).toLocaleString()}</span></li>
      </ul>
      <div class="grid2">
        <div>
          <div class="heatwrap">
            <canvas ref={canvas} class="heatmap" width={WIDTH} height={lay?.height ?? 400} onClick={onClick} tabIndex={0}
              role="application" aria-roledescription="heatmap" aria-describedby="heat-focus"
              aria-label="GPU occupancy per node, by block and rack. Arrow keys move between nodes, Home and End go to the first and last, Enter opens the focused node."
              onKeyDown={onKey} onFocus={() => { setFocused(true); if (focus === null) setFocus(0); }} onBlur={() => setFocused(false)} />
            {focused && lay && focusIndex !== null && (
              <div class="focus-cell" aria-hidden="true" style={{ left: `${lay.x[focusIndex] - 2}px`, top: `${lay.y[focusIndex] - 2}px` }} />
            )}
          </div>
          <p id="heat-focus" class="hint" aria-live="polite" data-testid="heat-focus" data-node={cols && focusIndex !== null ? cols.name[focusIndex] : ""}>
            {spoken ?? "Tab to the heatmap to move between nodes with the arrow keys."}
          </p>
        </div>
        <div>{selected ? <NodePanel name={selected} /> : <p class="hint">Click a node to see its pods and recent decisions.</p>}</div>
      </div>
    </>
  );
}

function NodeLookup({ onOpen }: { onOpen: (n: string) => void }) {
  const [v, setV] = useState("");
  return (
    <form class="row" onSubmit={(e) => { e.preventDefault(); if (v.trim()) onOpen(v.trim()); }}>
      <label for="node-name">Node</label>
      <input id="node-name" value={v} placeholder="a100-42" onInput={(e) => setV((e.target as HTMLInputElement).value)} />
      <button type="submit">Open</button>
    </form>
  );
}

function NodePanel({ name }: { name: string }) {
  const [d, setD] = useState<NodeDetail | null>(null);
  const [h, setH] = useState<NodeHealth | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    setD(null); setH(null); setError(null);
    const path = encodeURIComponent(name);
    get<NodeDetail>(`/api/cluster/nodes/${path}?limit=10`).then(setD).catch((e) => setError(message(e)));
    get<NodeHealth>(`/api/nodes/${path}/health?limit=20`).then(setH).catch(() => setH(null));
  }, [name]);
  return (
    <section class="card" aria-labelledby="node-title">
      <h2 id="node-title">Node {name}</h2>
      <Status error={error} />
      {d && (
        <>
          <p>{d.gpu_type}: {d.gpu_total - d.gpu_free} of {d.gpu_total} GPUs in use, {d.health}. {d.domains.join(", ")}.</p>
          <p data-testid="node-state"><span class="swatch" aria-hidden="true" style={{ background: STATE_COLOR[d.state] }} />Lifecycle state: <strong>{STATE_NAME[d.state] ?? d.state}</strong>.</p>
          <h3>Health history</h3>
          {h && h.transitions.length ? (
            <table aria-label="Health history" data-testid="node-health-history">
              <thead><tr><th>when</th><th>from → to</th><th>cause</th></tr></thead>
              <tbody>
                {h.transitions.map((t) => (
                  <tr data-to={t.to}><td><Ago ms={t.at_ms} now={h.at_ms} /></td><td>{STATE_NAME[t.from] ?? t.from} → {STATE_NAME[t.to] ?? t.to}</td><td>{t.cause}</td></tr>
                ))}
              </tbody>
            </table>
          ) : <p>{h ? "No step on record since the server started (it keeps the fleet's latest 10,000)." : "Not available."}</p>}
          <h3>Pods running here</h3>
          {d.jobs.length ? <ul>{d.jobs.map((j) => <li><a href={`#/jobs?name=${encodeURIComponent(j)}`}>{j}</a></li>)}</ul> : <p>None.</p>}
          <h3>Recent decisions</h3>
          {d.recent_decisions.length ? (
            <table>
              <thead><tr><th>time</th><th>job</th><th>outcome</th><th class="num">set</th></tr></thead>
              <tbody>
                {[...d.recent_decisions].reverse().map((r) => (
                  <tr><td>{time(r.time_ms)}</td><td><a href={`#/jobs?name=${encodeURIComponent(r.explanation.job)}`}>{r.explanation.job}</a></td>
                    <td>{r.explanation.outcome.kind}</td><td class="num">v{r.explanation.policy_set}</td></tr>
                ))}
              </tbody>
            </table>
          ) : <p>None on record.</p>}
        </>
      )}
    </section>
  );
}
