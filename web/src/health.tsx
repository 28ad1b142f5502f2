// The node health lifecycle's pieces shared by pages: each state's name and colour (the heatmap
// and its legend), and the circuit breaker's banner. The banner is on every page while the
// breaker is tripped, because a tripped breaker means failing nodes are left in service and
// someone should look; only an admin sees its Reset button (the server refuses a viewer too).
// It renders no <p> while the breaker is closed: the tests read a page's first paragraph.
import { useEffect, useState } from "preact/hooks";
import { get, message, post, type BreakerReset, type HealthView, type NodeState } from "./api";
import { Ago, Confirm, Status, duration } from "./ui";

/** Every state, in lifecycle order, with its name as people read it and its heatmap colour.
 * The testing states are purples, the troubled ones orange to red, retired near black: none
 * is a shade of the occupancy blues or the balloons' yellow. */
export const STATES: [NodeState, string, string][] = [
  ["preflight", "Preflight", "#7b2cbf"],
  ["ready", "Ready", "#6baed6"],
  ["suspect", "Suspect", "#ff8800"],
  ["draining", "Draining", "#e5383b"],
  ["repair", "Repair", "#a4161a"],
  ["retest", "Re-test", "#c77dff"],
  ["retired", "Retired", "#1b1b1b"],
];
export const STATE_COLOR = Object.fromEntries(STATES.map(([s, , c]) => [s, c])) as Record<NodeState, string>;
export const STATE_NAME = Object.fromEntries(STATES.map(([s, n]) => [s, n])) as Record<NodeState, string>;

/** The breaker: a banner while it is tripped (why, since when, what it held), with Reset for
 * an admin; with `showClosed`, a one-line "not tripped" too. Polls every 5 s. */
export function BreakerBanner({ admin, showClosed }: { admin: boolean; showClosed: boolean }) {
  const [health, setHealth] = useState<HealthView | null>(null);
  const [asking, setAsking] = useState(false);
  const [busy, setBusy] = useState(false);
  const [ok, setOk] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const load = () => get<HealthView>("/api/health?limit=1").then(setHealth).catch(() => {});
  useEffect(() => {
    void load();
    const timer = window.setInterval(load, 5000);
    return () => clearInterval(timer);
  }, []);
  const reset = async () => {
    setAsking(false); setBusy(true); setError(null); setOk(null);
    try {
      const r = await post<BreakerReset>("/api/health/reset");
      setOk(`Breaker reset by ${r.by}: it had tripped ${duration(r.reset_at_ms - r.tripped_at_ms)} before (${r.reason}) and held ${r.held} failure signal${r.held === 1 ? "" : "s"}. Automated cordons go ahead again.`);
      await load();
    } catch (e) {
      setError(message(e));
    } finally {
      setBusy(false);
    }
  };
  const b = health?.breaker;
  const done = <Status ok={ok} error={error} />;
  if (!b) return null;
  if (!b.tripped) {
    return (
      <>
        {(ok || error) && done}
        {showClosed && <div class="breaker-closed hint" data-testid="breaker-closed">Node health breaker: not tripped; automated cordons and drains go ahead.</div>}
      </>
    );
  }
  return (
    <>
      <div class="banner" role="alert" data-testid="breaker-banner">
        <span>
          <strong>Node health breaker tripped</strong>
          {b.tripped_at_ms != null && <> <Ago ms={b.tripped_at_ms} /></>}: {b.reason ?? "no reason given"}.
          Automated cordons and drains are held until an admin resets it; {b.held} failure signal{b.held === 1 ? "" : "s"} held so far.
        </span>
        {admin
          ? <button type="button" class="danger" onClick={() => setAsking(true)} disabled={busy}>{busy ? "Resetting…" : "Reset breaker"}</button>
          : <span class="hint">An admin can reset it.</span>}
      </div>
      {done}
      <Confirm open={asking} title="Reset the node health breaker?" onConfirm={reset} onCancel={() => setAsking(false)}>
        Automated cordons go ahead again: the next failure signal from a node cordons it and stops its gangs. The reset is audited under your name.
      </Confirm>
    </>
  );
}
