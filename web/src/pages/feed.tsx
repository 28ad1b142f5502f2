// The live decision feed: the SSE stream, read with fetch so the token travels in a header.
// "Placements only" hides pending decisions, which on a full cluster outnumber placements
// many times over and would push them out of the list within a second. Balloons' decisions
// (placed, or giving way to work) are hidden by default: on a full cluster they are most of
// the stream, and they are not anyone's work.
import { useEffect, useState } from "preact/hooks";
import { message, stream, type DecisionEvent } from "../api";
import { Status, time } from "../ui";

const KEEP = 200;

export function FeedPage() {
  const [events, setEvents] = useState<DecisionEvent[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [count, setCount] = useState(0);
  const [placedOnly, setPlacedOnly] = useState(false);
  const [showBalloons, setShowBalloons] = useState(false);
  useEffect(() => {
    const abort = new AbortController();
    let buffer: DecisionEvent[] = [];
    const keep = (e: DecisionEvent) => (!placedOnly || e.placed) && (showBalloons || !e.balloon);
    // Decisions arrive in bursts of hundreds per cycle; render at most 4 times a second.
    const flush = setInterval(() => {
      if (!buffer.length) return;
      const fresh = buffer.reverse();
      buffer = [];
      setCount((c) => c + fresh.length);
      setEvents((old) => [...fresh.filter(keep), ...old].slice(0, KEEP));
    }, 250);
    stream("/api/decisions/stream", abort.signal, (data) => {
      try { buffer.push(JSON.parse(data) as DecisionEvent); } catch { /* a malformed event is skipped */ }
    }).catch((e) => { if (!abort.signal.aborted) setError(`The live feed stopped. ${message(e)}`); });
    return () => { abort.abort(); clearInterval(flush); };
  }, [placedOnly, showBalloons]);
  return (
    <>
      <h1>Live decision feed</h1>
      <Status error={error} />
      <div class="row">
        <input id="placed-only" type="checkbox" checked={placedOnly}
          onChange={(e) => { setEvents([]); setCount(0); setPlacedOnly((e.target as HTMLInputElement).checked); }} />
        <label for="placed-only">Placements only</label>
        <input id="show-balloons" type="checkbox" checked={showBalloons}
          onChange={(e) => { setEvents([]); setCount(0); setShowBalloons((e.target as HTMLInputElement).checked); }} />
        <label for="show-balloons">Show balloons</label>
      </div>
      <p aria-live="off">{count.toLocaleString()} decisions received; the newest {Math.min(KEEP, events.length)}{placedOnly ? " placements" : ""}{showBalloons ? "" : " of work (balloons hidden)"} are shown, newest first.</p>
      <ul class="feed" aria-label="Decisions">
        {events.map((e) => (
          <li data-set={e.policy_set} data-placed={e.placed ? "yes" : "no"} data-balloon={e.balloon ? "yes" : "no"} data-nodes={e.nodes.join(" ")}>
            <span class="mono">{time(e.time_ms)}</span>{" "}
            <span class={`tag ${e.placed ? "placed" : "pending"}`}>{e.placed ? "placed" : "pending"}</span>{" "}
            <a href={`#/jobs?name=${encodeURIComponent(e.job)}`}>{e.job}</a> ({e.queue}, {e.pods}×{e.gpus_per_pod} GPUs, set v{e.policy_set})
            {e.placed && <> on {e.nodes.slice(0, 4).join(", ")}{e.nodes.length > 4 ? ` and ${e.nodes.length - 4} more` : ""}{e.domain ? ` in ${e.domain}` : ""}</>}
            {!e.placed && <>: {e.summary}</>}
          </li>
        ))}
      </ul>
    </>
  );
}
