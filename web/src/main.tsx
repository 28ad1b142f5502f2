import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { call, message, token, type Caller } from "./api";
import { Status } from "./ui";
import { ClusterPage } from "./pages/cluster";
import { QueuesPage } from "./pages/queues";
import { JobsPage } from "./pages/jobs";
import { PoliciesPage } from "./pages/policies";
import { FeedPage } from "./pages/feed";
import { BreakerBanner } from "./health";
import "uplot/dist/uPlot.min.css";
import "./style.css";

const PAGES = [
  ["cluster", "Cluster"],
  ["queues", "Queues"],
  ["jobs", "Jobs and pods"],
  ["policies", "Policies"],
  ["feed", "Live feed"],
] as const;

/** `#/jobs?name=x` → ["jobs", {name: "x"}]; no page named → "" (the caller's landing page). */
function route(): [string, URLSearchParams] {
  const [path, query] = location.hash.replace(/^#\/?/, "").split("?");
  return [path ?? "", new URLSearchParams(query ?? "")];
}

function SignIn({ onSignedIn, error }: { onSignedIn: (c: Caller) => void; error: string | null }) {
  const [value, setValue] = useState("");
  const [err, setErr] = useState<string | null>(error);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    try {
      const who = await call<Caller>("/api/whoami", {}, value.trim());
      token.set(value.trim());
      onSignedIn(who);
    } catch (e) {
      setErr(message(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <main class="signin">
      <h1>Gantry</h1>
      <form onSubmit={submit}>
        <label for="token">Access token</label>
        <input id="token" type="password" autocomplete="off" value={value}
          onInput={(e) => setValue((e.target as HTMLInputElement).value)} required />
        <button type="submit" class="primary" disabled={busy}>Sign in</button>
      </form>
      <p class="hint">The token is in <code>tokens.yaml</code> in the server's data directory.</p>
      <Status error={err} />
    </main>
  );
}

function App() {
  const [who, setWho] = useState<Caller | null>(null);
  const [checking, setChecking] = useState(!!token.get());
  const [signInError, setSignInError] = useState<string | null>(null);
  const [[asked, params], setRoute] = useState(route());
  useEffect(() => {
    const on = () => setRoute(route());
    addEventListener("hashchange", on);
    return () => removeEventListener("hashchange", on);
  }, []);
  useEffect(() => {
    if (!token.get()) return;
    call<Caller>("/api/whoami")
      .then(setWho)
      .catch((e) => { token.clear(); setSignInError(message(e)); })
      .finally(() => setChecking(false));
  }, []);
  if (checking) return <main><p>Signing in…</p></main>;
  if (!who) return <SignIn onSignedIn={setWho} error={signInError} />;
  const admin = who.role === "admin";
  // A researcher (viewer) lands on their jobs; an admin on the cluster.
  const page = asked || (admin ? "cluster" : "jobs");
  return (
    <>
      <header>
        <span class="brand">Gantry</span>
        <nav aria-label="Pages">
          {PAGES.map(([id, label]) => (
            <a href={`#/${id}`} aria-current={page === id ? "page" : undefined}>{label}</a>
          ))}
        </nav>
        <span class="who">{who.name} ({who.role})</span>
        <button type="button" onClick={() => { token.clear(); setWho(null); }}>Sign out</button>
      </header>
      <main id="main">
        <BreakerBanner admin={admin} showClosed={page === "cluster"} />
        {page === "cluster" && <ClusterPage />}
        {page === "queues" && <QueuesPage />}
        {page === "jobs" && <JobsPage name={params.get("name") ?? ""} />}
        {page === "policies" && <PoliciesPage admin={admin} />}
        {page === "feed" && <FeedPage />}
      </main>
    </>
  );
}

render(<App />, document.getElementById("app")!);
