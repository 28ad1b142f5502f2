// Policies and set versions for everyone; for admins also the audit trail, upload (validate
// first), shadow mode, activate and roll back, each behind a confirmation. A viewer's page has
// none of those in it at all (the server refuses a viewer the audit log).
import { useEffect, useState } from "preact/hooks";
import { call, get, message, post, type AuditEntry, type Explanation, type Manifest, type NewSet, type PolicySet, type SetEntry, type SetList, type ShadowReport, type Upload as UploadAnswer, type Validation } from "../api";
import { Confirm, Status, dateTime, short, time } from "../ui";

interface Pending { title: string; text: string; run: () => Promise<string> }

export function PoliciesPage({ admin }: { admin: boolean }) {
  const [policies, setPolicies] = useState<Manifest[]>([]);
  const [sets, setSets] = useState<SetList | null>(null);
  const [shadow, setShadow] = useState<ShadowReport | null>(null);
  const [audit, setAudit] = useState<AuditEntry[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [ok, setOk] = useState<string | null>(null);
  const [confirm, setConfirm] = useState<Pending | null>(null);

  const load = async () => {
    try {
      const [p, s, a] = await Promise.all([get<Manifest[]>("/api/policies"), get<SetList>("/api/sets"), admin ? get<AuditEntry[]>("/api/audit?limit=50") : Promise.resolve([])]);
      setPolicies(p); setSets(s); setAudit(a);
      try { setShadow(await get<ShadowReport>("/api/shadow")); } catch { setShadow(null); }
    } catch (e) { setError(message(e)); }
  };
  useEffect(() => { load(); const t = setInterval(load, 3000); return () => clearInterval(t); }, []);

  const ask = (p: Pending) => { setError(null); setOk(null); setConfirm(p); };
  const run = async () => {
    const p = confirm!;
    setConfirm(null);
    try { setOk(await p.run()); } catch (e) { setError(message(e)); }
    load();
  };
  const byHash = new Map(policies.map((p) => [p.sha256, p]));
  const describe = (e: SetEntry) => {
    const m = byHash.get(e.sha256);
    const extra = [e.failure && e.failure !== "default" ? e.failure : "", e.deadline_ms ? `deadline ${e.deadline_ms} ms` : ""].filter(Boolean).join(", ");
    return `${m ? `${m.name} ${m.version}` : short(e.sha256)} (weight ${e.weight}, config ${e.config}${extra ? `, ${extra}` : ""})`;
  };

  return (
    <>
      <h1>Policies</h1>
      <Status error={error} ok={ok} />
      {admin && <Upload sets={sets} byHash={byHash} ask={ask} />}
      {admin && sets && <Compose sets={sets} policies={policies} ask={ask} />}
      {sets && sets.running.length > 0 && (
        <>
          <h2>Running now (v{sets.active})</h2>
          <table>
            <thead><tr><th>policy</th><th>role</th><th class="num">calls</th><th class="num">faults</th><th>state</th></tr></thead>
            <tbody>{sets.running.map((p) => (
              <tr>
                <td>{p.name} {p.version}</td><td>{p.role}</td><td class="num">{p.calls}</td><td class="num">{p.faults}</td>
                <td>{p.quarantined
                  ? <span class="badge bad" title={p.last_fault ?? ""}>quarantined after {p.consecutive_faults} faults; next probe in {Math.ceil((p.probe_in_ms ?? 0) / 1000)} s</span>
                  : p.consecutive_faults > 0 ? <span class="badge warn" title={p.last_fault ?? ""}>{p.consecutive_faults} faults in a row</span> : "healthy"}</td>
              </tr>
            ))}</tbody>
          </table>
        </>
      )}
      <h2>Policy set versions</h2>
      {sets && (
        <table>
          <thead><tr><th class="num">version</th><th>policies, in order</th><th>created</th><th>note</th>{admin && <th>actions</th>}</tr></thead>
          <tbody>{[...sets.sets].reverse().map((s) => (
            <tr>
              <td class="num">v{s.version}{s.version === sets.active && <strong> (active)</strong>}</td>
              <td>{s.entries.map(describe).join("; ")}</td>
              <td>{s.created_by}, {dateTime(s.created_at_ms)}</td><td>{s.note}</td>
              {admin && <td>
                {s.version !== sets.active && (s.version > sets.active
                  ? <button type="button" class="primary" onClick={() => ask({ title: `Activate v${s.version}?`, text: `New cycles will run policy set v${s.version} instead of v${sets.active}.`,
                      run: async () => { await post(`/api/sets/${s.version}/activate`); return `Policy set v${s.version} is active.`; } })}>Activate v{s.version}</button>
                  : <button type="button" class="danger" onClick={() => ask({ title: `Roll back to v${s.version}?`, text: `New cycles will run policy set v${s.version} instead of v${sets.active}.`,
                      run: async () => { await post(`/api/sets/${s.version}/rollback`); return `Rolled back to policy set v${s.version}.`; } })}>Roll back to v{s.version}</button>)}
                {s.version !== sets.active && !shadow && <button type="button" onClick={() => ask({ title: `Shadow v${s.version}?`, text: `Every cycle will also run v${s.version} and record where it would decide differently. Nothing it decides takes effect.`,
                  run: async () => { await post("/api/shadow", { version: s.version }); return `Shadow mode started for v${s.version}.`; } })}>Shadow v{s.version}</button>}
              </td>}
            </tr>
          ))}</tbody>
        </table>
      )}
      <h2>Shadow mode</h2>
      {shadow ? (
        <div class="card" data-testid="shadow-report" data-disagreements={Object.values(shadow.counts).reduce((a, b) => a + b, 0)}>
          <p>Candidate v{shadow.candidate_version}, started by {shadow.started_by} at {time(shadow.started_ms)}: {plural(shadow.cycles, "cycle")}, {plural(shadow.decisions_compared, "decision")} compared,{" "}
            {plural(Object.values(shadow.counts).reduce((a, b) => a + b, 0), "disagreement")}
            {Object.keys(shadow.counts).length > 0 && <> ({Object.entries(shadow.counts).map(([k, v]) => `${k}: ${v}`).join(", ")})</>}.</p>
          {admin && <button type="button" onClick={() => ask({ title: "Stop shadow mode?", text: `The report for v${shadow.candidate_version} is dropped.`,
            run: async () => { await call("/api/shadow", { method: "DELETE" }); return "Shadow mode stopped."; } })}>Stop shadow mode</button>}
          {shadow.recent.length > 0 && (
            <table aria-label="Recent disagreements">
              <thead><tr><th>time</th><th>job</th><th>kind</th><th>active decided</th><th>candidate would</th></tr></thead>
              <tbody>{shadow.recent.slice(-15).reverse().map((d) => (
                <tr><td>{time(d.time_ms)}</td><td>{d.job}</td><td>{d.kind}</td><td>{outcome(d.active)}</td><td>{outcome(d.candidate)}</td></tr>
              ))}</tbody>
            </table>
          )}
        </div>
      ) : <p>No shadow run is active.</p>}
      <h2>Stored policies</h2>
      <table>
        <thead><tr><th>name</th><th>version</th><th>role</th><th>sha256</th><th class="num">size</th><th>uploaded</th></tr></thead>
        <tbody>{policies.map((p) => (
          <tr><td>{p.name}</td><td>{p.version}</td><td>{p.role}</td><td class="mono">{short(p.sha256)}</td>
            <td class="num">{Math.round(p.size / 1024)} KiB</td><td>{p.uploaded_by}, {dateTime(p.uploaded_at_ms)}</td></tr>
        ))}</tbody>
      </table>
      {admin && <>
        <h2>Audit trail</h2>
        <table aria-label="Audit trail">
          <thead><tr><th>when</th><th>who</th><th>from</th><th>action</th><th>detail</th></tr></thead>
          <tbody>{audit.map((a) => <tr><td>{dateTime(a.at_ms)}</td><td>{a.who}</td><td>{a.from}</td><td>{a.action}</td><td>{a.detail}</td></tr>)}</tbody>
        </table>
      </>}
      {admin && <Confirm open={!!confirm} title={confirm?.title ?? ""} onConfirm={run} onCancel={() => setConfirm(null)}><p>{confirm?.text}</p></Confirm>}
    </>
  );
}

const plural = (n: number, word: string) => `${n.toLocaleString()} ${word}${n === 1 ? "" : "s"}`;

function outcome(x: Pick<Explanation, "outcome" | "domain">) {
  return x.outcome.kind === "placed" ? `placed on ${x.outcome.nodes!.map(([n]) => n).slice(0, 3).join(", ")}${x.domain ? ` (${x.domain})` : ""}` : "pending";
}

function Upload({ sets, byHash, ask }: { sets: SetList | null; byHash: Map<string, Manifest>; ask: (p: Pending) => void }) {
  const [file, setFile] = useState<File | null>(null);
  const [config, setConfig] = useState("{}");
  const [weight, setWeight] = useState(1);
  const [deadline, setDeadline] = useState("");
  const [validation, setValidation] = useState<Validation | null>(null);
  const [error, setError] = useState<string | null>(null);
  const query = () => `config=${encodeURIComponent(config.trim() || "{}")}${deadline ? `&deadline_ms=${encodeURIComponent(deadline)}` : ""}`;
  const checkConfig = () => {
    try { JSON.parse(config.trim() || "{}"); return true; } catch (e) { setError(`The config is not valid JSON: ${(e as Error).message}`); return false; }
  };
  const validate = async () => {
    setError(null); setValidation(null);
    if (!file) return setError("Choose a .wasm file first.");
    if (!checkConfig()) return;
    try { setValidation(await call<Validation>(`/api/policies/validate?${query()}`, { method: "POST", body: file })); } catch (e) { setError(message(e)); }
  };
  const upload = () => {
    setError(null);
    if (!file) return setError("Choose a .wasm file first.");
    if (!checkConfig() || !sets) return;
    const active = sets.sets.find((s) => s.version === sets.active);
    ask({
      title: `Upload ${file.name}?`,
      text: `The policy is validated and stored, and a new set version is created from the active set v${sets.active} with it (replacing the policy of the same name). Nothing changes until you activate that version.`,
      run: async () => {
        const up = await call<UploadAnswer>(`/api/policies?${query()}`, { method: "POST", body: file });
        setValidation(up.validation);
        const entry: SetEntry = { sha256: up.manifest.sha256, weight, config: config.trim() || "{}", deadline_ms: deadline ? Number(deadline) : null };
        const entries = (active?.entries ?? []).map((e) => ({ ...e }));
        const same = entries.findIndex((e) => byHash.get(e.sha256)?.name === up.manifest.name);
        if (same >= 0) entries[same] = entry; else entries.push(entry);
        const set = await post<PolicySet, NewSet>("/api/sets", { entries, note: `upload of ${file.name} from the web UI` });
        return `Uploaded ${up.manifest.name} ${up.manifest.version} (${short(up.manifest.sha256)}) and created policy set v${set.version}.`;
      },
    });
  };
  return (
    <section class="card" aria-labelledby="upload-title">
      <h2 id="upload-title">Upload a policy</h2>
      <div class="row">
        <label for="wasm">.wasm file</label>
        <input id="wasm" type="file" accept=".wasm,application/wasm" onChange={(e) => { setFile((e.target as HTMLInputElement).files?.[0] ?? null); setValidation(null); }} />
        <label for="weight">Weight</label>
        <input id="weight" type="number" min={1} max={1000} value={weight} onInput={(e) => setWeight(Number((e.target as HTMLInputElement).value) || 1)} />
        <label for="upload-deadline">Deadline (ms)</label>
        <input id="upload-deadline" type="number" min={1} max={10000} placeholder="50" value={deadline} onInput={(e) => setDeadline((e.target as HTMLInputElement).value)} />
      </div>
      <label for="config">Config (JSON)</label>
      <textarea id="config" rows={3} value={config} onInput={(e) => setConfig((e.target as HTMLTextAreaElement).value)} />
      <div class="row">
        <button type="button" onClick={validate}>Validate</button>
        <button type="button" class="primary" onClick={upload}>Upload and create a set version</button>
      </div>
      <Status error={error} />
      {validation && (
        <div class="ok" role="status" data-testid="validation">
          Valid: {validation.name} {validation.version}, a {validation.role} policy, {Math.round(validation.size / 1024)} KiB, sha256 {short(validation.sha256)}.
          Self-test: {validation.self_test}
          {validation.reasons.length > 0 && <> Reasons: {validation.reasons.map(([c, t]) => `${c} ${t}`).join("; ")}.</>}
        </div>
      )}
    </section>
  );
}

/** A set version built from another: add, replace, remove and reorder policies, and set each
 * entry's weight, config, failure policy and deadline. Nothing runs it until it is activated. */
function Compose({ sets, policies, ask }: { sets: SetList; policies: Manifest[]; ask: (p: Pending) => void }) {
  const [from, setFrom] = useState(sets.active);
  const [entries, setEntries] = useState<SetEntry[]>([]);
  const [note, setNote] = useState("");
  const [adding, setAdding] = useState("");
  const [error, setError] = useState<string | null>(null);
  const base = sets.sets.find((s) => s.version === from);
  useEffect(() => { setEntries((base?.entries ?? []).map((e) => ({ ...e }))); }, [from, base?.entries.length]);
  const label = (sha: string) => { const m = policies.find((p) => p.sha256 === sha); return m ? `${m.name} ${m.version} (${m.role}, ${short(m.sha256)})` : short(sha); };
  const edit = (i: number, change: Partial<SetEntry>) => setEntries(entries.map((e, k) => (k === i ? { ...e, ...change } : e)));
  const move = (i: number, by: number) => {
    const next = [...entries];
    const [e] = next.splice(i, 1);
    next.splice(Math.max(0, Math.min(next.length, i + by)), 0, e);
    setEntries(next);
  };
  const create = () => {
    setError(null);
    if (entries.length === 0) return setError("A policy set needs at least one policy.");
    for (const e of entries) {
      try { JSON.parse(e.config || "{}"); } catch (x) { return setError(`The config of ${label(e.sha256)} is not valid JSON: ${(x as Error).message}`); }
    }
    const body = entries.map((e) => ({ ...e, config: e.config.trim() || "{}", deadline_ms: e.deadline_ms || null }));
    ask({
      title: "Create a policy set version?",
      text: `A new version is made from v${from} with ${entries.length} policies. Nothing changes until you activate it.`,
      run: async () => {
        const set = await post<PolicySet, NewSet>("/api/sets", { entries: body, note: note.trim() || `composed from v${from} in the web UI` });
        return `Created policy set v${set.version}.`;
      },
    });
  };
  return (
    <section class="card" aria-labelledby="compose-title">
      <h2 id="compose-title">Compose a policy set</h2>
      <div class="row">
        <label for="compose-from">Start from</label>
        <select id="compose-from" value={from} onChange={(e) => setFrom(Number((e.target as HTMLSelectElement).value))}>
          {[...sets.sets].reverse().map((s) => <option value={s.version}>v{s.version}{s.version === sets.active ? " (active)" : ""}</option>)}
        </select>
      </div>
      <table aria-label="Entries of the new set">
        <thead><tr><th>policy</th><th>weight</th><th>config (JSON)</th><th>on fault</th><th>deadline (ms)</th><th>order</th></tr></thead>
        <tbody>{entries.map((e, i) => (
          <tr>
            <td>
              <label class="sr-only" for={`entry-policy-${i}`}>Policy of entry {i + 1}</label>
              <select id={`entry-policy-${i}`} value={e.sha256} onChange={(x) => edit(i, { sha256: (x.target as HTMLSelectElement).value })}>
                {policies.map((p) => <option value={p.sha256}>{label(p.sha256)}</option>)}
              </select>
            </td>
            <td><input aria-label={`Weight of entry ${i + 1}`} type="number" min={0} max={1000} value={e.weight} onInput={(x) => edit(i, { weight: Number((x.target as HTMLInputElement).value) || 0 })} /></td>
            <td><textarea aria-label={`Config of entry ${i + 1}`} rows={1} value={e.config} onInput={(x) => edit(i, { config: (x.target as HTMLTextAreaElement).value })} /></td>
            <td>
              <select aria-label={`On fault, entry ${i + 1}`} value={e.failure ?? "default"} onChange={(x) => edit(i, { failure: (x.target as HTMLSelectElement).value as SetEntry["failure"] })}>
                <option value="default">role's default</option><option value="fail-open">fail open</option><option value="fail-closed">fail closed</option>
              </select>
            </td>
            <td><input aria-label={`Deadline of entry ${i + 1}`} type="number" min={1} max={10000} placeholder="50" value={e.deadline_ms ?? ""} onInput={(x) => { const v = (x.target as HTMLInputElement).value; edit(i, { deadline_ms: v ? Number(v) : null }); }} /></td>
            <td>
              <button type="button" aria-label={`Move entry ${i + 1} up`} disabled={i === 0} onClick={() => move(i, -1)}>↑</button>
              <button type="button" aria-label={`Move entry ${i + 1} down`} disabled={i === entries.length - 1} onClick={() => move(i, 1)}>↓</button>
              <button type="button" class="danger" onClick={() => setEntries(entries.filter((_, k) => k !== i))}>Remove</button>
            </td>
          </tr>
        ))}</tbody>
      </table>
      <div class="row">
        <label for="compose-add">Add a policy</label>
        <select id="compose-add" value={adding} onChange={(e) => setAdding((e.target as HTMLSelectElement).value)}>
          <option value="">choose…</option>
          {policies.map((p) => <option value={p.sha256}>{label(p.sha256)}</option>)}
        </select>
        <button type="button" disabled={!adding} onClick={() => { setEntries([...entries, { sha256: adding, weight: 1, failure: "default", config: "{}", deadline_ms: null }]); setAdding(""); }}>Add</button>
      </div>
      <div class="row">
        <label for="compose-note">Note</label>
        <input id="compose-note" size={50} value={note} onInput={(e) => setNote((e.target as HTMLInputElement).value)} placeholder={`composed from v${from}`} />
        <button type="button" class="primary" onClick={create}>Create set version</button>
      </div>
      <Status error={error} />
    </section>
  );
}
