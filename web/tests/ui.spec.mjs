// Browser tests of the web UI against a real `gantry serve`: @playwright/test driving Debian's
// Chromium, headless (playwright.config.mjs). Started by scripts/ui-test.sh, which passes the
// server's address and tokens. Checks roles, the admin's policy round trip, a researcher's "why
// pending", axe-core on every page, and saves a screenshot of each page. The tests run in order
// against the one server, one worker, in file order: later ones rely on the policy set state
// the earlier leave. A failed test does not stop the rest (Playwright starts a new worker for
// them), so one failure never hides another.
// Speed figures are measured and printed, not asserted: the machine is shared and noisy. They
// go, with each test's outcome and the axe findings, to results.json beside the screenshots;
// a failed test also leaves its trace and a screenshot (see the config).
import { test as base, expect } from "@playwright/test";
import { createRequire } from "node:module";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";

const env = (k, d) => process.env[k] ?? d ?? (() => { throw new Error(`${k} is not set`); })();
const BASE = env("GANTRY_URL");
const ADMIN = env("ADMIN_TOKEN");
const VIEWER = env("VIEWER_TOKEN");
const PLUGINS = env("PLUGIN_DIR");
const OUT = resolve(env("UI_ARTIFACTS"));
const AXE_SOURCE = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
mkdirSync(OUT, { recursive: true });

const results = [];
const figures = {};
const axeFindings = {};

/** A fresh context signed in with `token` (in sessionStorage, as the sign-in form leaves it). */
async function signedIn(browser, token, use) {
  const context = await browser.newContext();
  await context.addInitScript((t) => sessionStorage.setItem("gantry.token", t), token);
  const page = await context.newPage();
  page.on("pageerror", (e) => console.log(`  page error: ${e.message}`));
  await use(page);
  await context.close();
}
const test = base.extend({
  adminPage: async ({ browser }, use) => signedIn(browser, ADMIN, use),
  viewerPage: async ({ browser }, use) => signedIn(browser, VIEWER, use),
});

/** The API's JSON answer to GET `path`, with `token`. */
const api = async (token, path) => (await fetch(`${BASE}${path}`, { headers: { Authorization: `Bearer ${token}` } })).json();

async function shot(page, name) {
  await page.screenshot({ path: join(OUT, `${name}.png`), fullPage: true });
}
/** axe-core on the page as it is: no serious or critical violation. Every finding is kept. */
async function axe(page, name) {
  await test.step(`axe-core on ${name}`, async () => {
    // The server's Content-Security-Policy refuses inline scripts, as it should; axe goes in
    // through the DevTools protocol instead of a <script> tag.
    if (!(await page.evaluate(() => "axe" in window))) await page.evaluate(AXE_SOURCE);
    const found = await page.evaluate(async () => {
      const r = await window.axe.run(document, { resultTypes: ["violations"] });
      return r.violations.map((v) => ({ id: v.id, impact: v.impact, nodes: v.nodes.length, help: v.help }));
    });
    axeFindings[name] = found;
    const serious = found.filter((v) => v.impact === "serious" || v.impact === "critical");
    expect(serious.map((v) => `${v.id} (${v.impact}, ${v.nodes} nodes): ${v.help}`), `axe on ${name}`).toEqual([]);
  });
}
/** `s` as a regular expression matching it literally. */
const literal = (s) => String(s).replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
const go = async (page, hash, ready) => {
  await page.goto(`${BASE}/#/${hash}`);
  await page.locator(ready).first().waitFor({ timeout: 15000 });
};

test.afterEach(async ({}, testInfo) => {
  const error = testInfo.error && (testInfo.error.stack ?? testInfo.error.message ?? "").replace(/\u001b\[[0-9;]*m/g, "");
  results.push({ name: testInfo.title, ok: testInfo.status === testInfo.expectedStatus, status: testInfo.status, ...(error ? { error } : {}) });
});

test.afterAll(async () => {
  // After a failure the remaining tests run in a new worker, with fresh module state: each
  // worker adds what it saw to what the earlier ones wrote (ui-test.sh starts with no file).
  const file = join(OUT, "results.json");
  let earlier = { results: [], figures: {}, axe: {} };
  try { earlier = JSON.parse(readFileSync(file, "utf8")); } catch {}
  Object.assign(figures, { ...earlier.figures, ...figures });
  Object.assign(axeFindings, { ...earlier.axe, ...axeFindings });
  results.unshift(...earlier.results.filter((r) => !results.some((x) => x.name === r.name)));
  writeFileSync(file, JSON.stringify({ results, figures, axe: axeFindings }, null, 2));
  console.log("\nfigures (measured, not asserted):");
  console.log(`  first load of the cluster page with 7,500 nodes: ${figures.first_load_ms} ms (goal <= 1000)`);
  console.log(`  cluster live updates: ${figures.update_hz} Hz (goal >= 1)`);
  console.log(`  frame time p95 while updating: ${figures.frame_p95_ms} ms (goal <= 50); slowest heatmap draw ${figures.draw_max_ms} ms`);
  console.log(`  heatmap keyboard: ${figures.keyboard}; one arrow press to the next frame ${figures.key_move_ms} ms`);
  console.log(`  queues: ${figures.lent}`);
  console.log(`  queue history: ${figures.history}`);
  console.log(`  composed in the UI: ${figures.composed}`);
  console.log(`  first pending job: ${figures.first_pending_job}`);
  console.log(`  an estimate: ${figures.estimate_example}; what-if rows: ${figures.what_if_rows}`);
  console.log(`  what-if form: ${figures.what_if_form}`);
  console.log(`  jobs list: ${figures.listed_estimates}`);
  console.log(`  consistency: ${figures.consistency}`);
  console.log(`  nodes held mostly by balloons (the heatmap shade): ${figures.balloon_nodes}`);
  console.log(`  a preempted job's history: ${figures.preempted_history}`);
  console.log(`  nodes by lifecycle state: ${figures.lifecycle_states}`);
  console.log(`  a failed node's health history: ${figures.node_health}`);
  console.log(`  a restarted job: ${figures.restarted_job}`);
  console.log(`  keep-off config: ${figures.keep_off_config}; self-test: ${figures.keep_off_self_test}`);
  console.log(`  shadow report: ${figures.shadow}`);
  console.log(`  placements on kept-off nodes: under v1 before ${figures.v1_placements_on_kept_off}; after activation ${figures.v_placements_on_kept_off}; after rollback to v1 ${figures.v1_after_rollback_on_kept_off}`);
  console.log(`  axe-core: ${Object.entries(axeFindings).map(([p, v]) => `${p} ${v.length ? v.map((x) => `${x.id}/${x.impact}`).join(",") : "clean"}`).join("; ")}`);
  console.log(`  screenshots: ${OUT}`);
});

test("first screen: a viewer lands on Jobs, an admin on the cluster", async ({ viewerPage, adminPage }) => {
  await viewerPage.goto(`${BASE}/`);
  await viewerPage.locator("#job-q").waitFor({ timeout: 15000 });
  expect(await viewerPage.locator('nav a[aria-current="page"]').innerText(), "a viewer's first page").toBe("Jobs and pods");
  await adminPage.goto(`${BASE}/`);
  await adminPage.locator("canvas.heatmap").waitFor({ timeout: 15000 });
  expect(await adminPage.locator('nav a[aria-current="page"]').innerText(), "an admin's first page").toBe("Cluster");
});

test("what-if form: 16 × 8 GPUs in a queue, answered as a duration", async ({ viewerPage: page }) => {
  await go(page, "jobs", "#job-q");
  await page.getByText("If I submitted…").click();
  const queue = await page.locator("#wi-queue option").first().getAttribute("value");
  await page.fill("#wi-pods", "16");
  await page.fill("#wi-gpus", "8");
  await page.getByRole("button", { name: "When would it start?" }).click();
  const answer = page.getByTestId("whatif-answer");
  await answer.waitFor({ timeout: 30000 });
  const text = await answer.innerText();
  // An estimate as a duration from now, or the sentence saying why there is none.
  expect(text.trim(), "the what-if's answer").not.toBe("");
  if (text.startsWith("It would start")) expect(text).toMatch(/^It would start (in about \d|at its next attempt)/);
  expect(text, "a duration, not a clock time").not.toMatch(/\d\d:\d\d/);
  // Against the jobs already pending in that queue (a figure: the planner issue's what-if line).
  const ahead = (await api(VIEWER, `/api/jobs?state=pending&queue=${encodeURIComponent(queue)}&limit=10000`))
    .filter((j) => j.estimate).map((j) => j.estimate.p50_ms);
  const startMs = Number(await answer.getAttribute("data-start-ms"));
  figures.what_if_form = `${queue}, 16 × 8: "${text}", start or bound ${startMs ? new Date(startMs).toISOString() : "none"}; latest estimate among ${ahead.length} estimated pending jobs of ${queue}: ${ahead.length ? new Date(Math.max(...ahead)).toISOString() : "none"}`;
});

test("consistency: 200 pending jobs and the estimated ones each wait for one thing, and a what-if like a job is never earlier", async () => {
  const post = async (path, body) => (await fetch(`${BASE}${path}`, {
    method: "POST",
    headers: { Authorization: `Bearer ${VIEWER}`, "Content-Type": "application/json" },
    body: JSON.stringify(body),
  })).json();
  // Every k-th pending job, so that each queue's head and its tail are both in the sample.
  // The demo fills its queues within its first cycles; a test that runs first can come
  // before them.
  let pending = [];
  await expect
    .poll(async () => (pending = await api(VIEWER, "/api/jobs?state=pending&limit=10000")).length, {
      message: "pending jobs on the overloaded demo",
      timeout: 60_000,
    })
    .toBeGreaterThan(0);
  const step = Math.max(1, Math.floor(pending.length / 200));
  // And every job with an estimate (up to 50): on the overloaded demo few have one, and the
  // estimate's own "waiting for" must be seen to agree.
  const withEstimate = pending.filter((j, i) => j.estimate && i % step !== 0).slice(0, 50);
  const sample = [...pending.filter((_, i) => i % step === 0).slice(0, 200), ...withEstimate];
  const seen = { checked: 0, started_meanwhile: 0, estimated: 0, reasons: 0, quota_refused: 0, read_again: 0 };
  const estimated = [];
  for (const row of sample) {
    let e = await api(VIEWER, `/api/explain/${encodeURIComponent(row.name)}`);
    // The estimate is the loop's last published view and the explanation its last stored
    // record: a cycle that lands between the two reads makes them differ once, so a mismatch
    // is read once more before it counts.
    if (e.estimate && e.estimate.waiting_for !== e.waiting_for) {
      seen.read_again++;
      await new Promise((done) => setTimeout(done, 1500));
      e = await api(VIEWER, `/api/explain/${encodeURIComponent(row.name)}`);
    }
    if (e.state !== "pending") { seen.started_meanwhile++; continue; }
    seen.checked++;
    // One or the other, never both, never neither.
    expect(Boolean(e.estimate) !== Boolean(e.no_estimate), `${row.name}: an estimate or a reason: ${JSON.stringify([e.estimate, e.no_estimate])}`).toBe(true);
    if (e.estimate) { seen.estimated++; estimated.push(e); } else seen.reasons++;
    // The estimate waits for what the explanation says, word for word, and says so.
    if (e.estimate) {
      expect(e.estimate.waiting_for, `${row.name}: the estimate's "waiting for" against the explanation's`).toBe(e.waiting_for);
      if (e.waiting_for) expect(e.estimate.text).toContain(`it waits for ${e.waiting_for}`);
    }
    const refused = e.latest !== null && e.waiting_for !== null && e.waiting_for !== undefined;
    if (refused && e.waiting_for.startsWith("quota:")) seen.quota_refused++;
    // The estimate never says room is free while the explanation says it was refused.
    if (refused) expect(e.estimate?.text ?? "", `${row.name} waits for "${e.waiting_for}"`).not.toMatch(/free now/);
  }
  expect(seen.checked, `jobs still pending when read: ${JSON.stringify(seen)}`).toBeGreaterThan(0);
  // A what-if like a job is tried after it: never earlier than its own estimate, as it stood
  // before or after the what-if (a forecast may land in between).
  const like = { asked: 0, compared: 0, no_start: 0 };
  for (const e of estimated.slice(0, 5)) {
    like.asked++;
    const answer = await post("/api/whatif", { like: e.name });
    const after = await api(VIEWER, `/api/explain/${encodeURIComponent(e.name)}`);
    const start = answer?.answer?.estimate?.p50_ms;
    if (start === undefined) { like.no_start++; continue; }
    like.compared++;
    const own = Math.min(e.estimate.p50_ms, after.estimate?.p50_ms ?? Infinity);
    // The API's times are whole milliseconds mapped from the scheduler's clock: a second's slack.
    expect(start, `what-if like ${e.name}: ${answer.answer.text}; its own: ${e.estimate.text}`).toBeGreaterThanOrEqual(own - 1000);
  }
  figures.consistency = `${JSON.stringify(seen)} of a ${sample.length}-job sample (${withEstimate.length} of them for their estimate) of ${pending.length} pending; what-if like a job: ${JSON.stringify(like)}`;
});

test("sign-in: a wrong token gets a readable message", async ({ page }) => {
  await page.goto(`${BASE}/`);
  await page.getByLabel("Access token").fill("not-a-real-token-at-all");
  await page.getByRole("button", { name: "Sign in" }).click();
  const text = await page.getByRole("alert").innerText();
  expect(text, "the sign-in message").toMatch(/token was not accepted/i);
  expect(text, "the sign-in message is a sentence, not JSON").not.toContain("{");
  await axe(page, "sign-in");
  await shot(page, "sign-in");
});

test("cluster: first load with 7,500 nodes, live updates, frame times", async ({ viewerPage: page }) => {
  await page.goto(`${BASE}/#/cluster`);
  await page.waitForFunction(() => (window.__gantryCluster?.draws.length ?? 0) > 0, null, { timeout: 15000 });
  figures.first_load_ms = Math.round(await page.evaluate(() => window.__gantryCluster.updates[0]));
  const nodes = await page.evaluate(() => document.querySelector("main p")?.textContent ?? "");
  expect(nodes, "the cluster summary").toContain("7,500 nodes");
  // Frame times over 6 s of live updates, from requestAnimationFrame.
  const m = await page.evaluate(() => new Promise((done) => {
    const frames = [];
    let last = performance.now();
    const start = last, u0 = window.__gantryCluster.updates.length;
    const tick = (t) => {
      frames.push(t - last); last = t;
      if (t - start < 6000) requestAnimationFrame(tick);
      else {
        const u = window.__gantryCluster.updates.slice(u0);
        const d = window.__gantryCluster.draws.slice(-u.length);
        done({ frames, updates: u.length, span: (u.at(-1) - u[0]) / 1000, draws: d });
      }
    };
    requestAnimationFrame(tick);
  }));
  const sorted = m.frames.slice(1).sort((a, b) => a - b);
  figures.frame_p95_ms = Math.round(sorted[Math.floor(sorted.length * 0.95)] * 10) / 10;
  figures.update_hz = Math.round(((m.updates - 1) / m.span) * 100) / 100;
  figures.draw_max_ms = Math.round(Math.max(...m.draws) * 10) / 10;
  expect(m.updates, "live updates in 6 s").toBeGreaterThanOrEqual(3);
  // Keyboard: Tab reaches the heatmap from the node lookup, the arrows move a visible focus
  // cell named in a live region, and Enter opens the focused node.
  await page.locator("#node-name").focus();
  await page.keyboard.press("Tab");
  await page.keyboard.press("Tab");
  expect(await page.evaluate(() => document.activeElement?.classList.contains("heatmap")), "Tab reaches the heatmap").toBe(true);
  const focusName = () => page.getByTestId("heat-focus").getAttribute("data-node");
  const start = await focusName();
  expect(start, "a focused node after Tab").toBeTruthy();
  await page.locator(".focus-cell").waitFor();
  await page.keyboard.press("ArrowDown");
  const down = await focusName();
  await page.keyboard.press("ArrowRight");
  const right = await focusName();
  expect(down !== start && right !== down, `arrows move the focus: ${start} → ${down} → ${right}`).toBe(true);
  const said = await page.getByTestId("heat-focus").innerText();
  expect(said, "the live region").toMatch(new RegExp(`^Node ${literal(right)}:.*GPUs in use`, "s"));
  // One arrow press, from keydown to the next frame, on 7,500 nodes.
  figures.key_move_ms = await page.evaluate(() => new Promise((done) => {
    const canvas = document.querySelector("canvas.heatmap");
    const t = performance.now();
    canvas.dispatchEvent(new KeyboardEvent("keydown", { key: "ArrowRight", bubbles: true }));
    requestAnimationFrame(() => done(Math.round((performance.now() - t) * 10) / 10));
  }));
  const opened = await focusName();
  await page.keyboard.press("Enter");
  await page.getByRole("heading", { name: `Node ${opened}`, exact: true }).waitFor();
  figures.keyboard = `Tab → ${start}, ↓ → ${down}, → → ${right}, Enter opened ${opened}`;
  // Balloon-held GPUs are shaded apart from work: the legend names the shade, and when some
  // node's GPUs in use are mostly balloons', the canvas has that colour on it.
  await expect(page.getByTestId("balloon-shade")).toHaveText(/balloons/);
  const shade = await page.evaluate(async () => {
    const cols = await (await fetch("/api/cluster/nodes", { headers: { Authorization: `Bearer ${sessionStorage.getItem("gantry.token") ?? ""}` } })).json().catch(() => null);
    const canvas = document.querySelector("canvas.heatmap");
    const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
    let painted = 0;
    for (let i = 0; i < px.length; i += 4) if (px[i] === 0xf6 && px[i + 1] === 0xd2 && px[i + 2] === 0x8b) painted++;
    const held = cols ? cols.name.filter((_, i) => cols.balloon_gpus[i] > cols.gpu_total[i] - cols.gpu_free[i] - cols.balloon_gpus[i]).length : -1;
    return { painted, held };
  });
  figures.balloon_nodes = shade.held;
  if (shade.held > 0) expect(shade.painted, `${shade.held} nodes held mostly by balloons, none painted so`).toBeGreaterThan(0);
  await page.selectOption("#f-health", "healthy");
  await page.locator("canvas.heatmap").click({ position: { x: 3, y: 17 } });
  await page.getByRole("heading", { name: /^Node / }).waitFor();
  await page.getByText("Recent decisions").waitFor();
  await axe(page, "cluster");
  await shot(page, "cluster");
});

test("feed: balloons' churn is hidden by default", async ({ viewerPage: page }) => {
  await go(page, "feed", "text=decisions received");
  expect(await page.getByLabel("Show balloons").isChecked(), "balloons hidden by default").toBe(false);
  await page.waitForFunction(() => document.querySelectorAll("ul.feed li").length >= 20, null, { timeout: 20000 });
  expect(await page.locator('ul.feed li[data-balloon="yes"]').count(), "balloon decisions shown by default").toBe(0);
  await expect(page.locator("main")).toContainText("balloons hidden");
});

test("queues: quota table, fair-share chart, pending jobs with position", async ({ viewerPage: page }) => {
  await go(page, "queues", "td");
  await page.locator(".uplot").waitFor();
  await page.getByRole("columnheader", { name: "lent", exact: true }).waitFor();
  // Lent capacity, from one answer of the API: at the top level, what the queues lend adds up
  // to what they borrow from each other (at most what they may lend); no queue lends more
  // than its quota.
  const queues = await api(VIEWER, "/api/queues");
  const roots = queues.filter((q) => q.parent === null);
  const sum = (xs, k) => xs.reduce((a, q) => a + q[k], 0);
  expect(sum(roots, "lent_gpus"),
    `top-level lent vs min(borrowed ${sum(roots, "borrowed_gpus")}, lendable ${sum(roots, "lendable_gpus")})`)
    .toBe(Math.min(sum(roots, "borrowed_gpus"), sum(roots, "lendable_gpus")));
  for (const q of queues) expect(q.lent_gpus, `${q.name} lends at most its quota: ${JSON.stringify(q)}`).toBeLessThanOrEqual(q.nominal_gpus);
  figures.lent = queues.map((q) => `${q.name} lent ${q.lent_gpus}, borrowed ${q.borrowed_gpus}`).join("; ");
  // The chart comes from the server's history, and grows with the next sample (every 5 s).
  const history = await api(VIEWER, "/api/queues/history");
  expect(history.queues.length === queues.length && history.queues.every((q) => q.at_ms.length >= 1 && q.fair_share_key.length === q.at_ms.length),
    `history: ${JSON.stringify(history).slice(0, 300)}`).toBe(true);
  const last = Math.max(...history.queues.map((q) => q.at_ms.at(-1)));
  const newer = await api(VIEWER, `/api/queues/history?since=${last}`);
  expect(newer.queues.every((q) => q.at_ms.every((t) => t > last)), "since= returns only newer samples").toBe(true);
  const samples = async () => Number(await page.getByTestId("history-summary").getAttribute("data-samples"));
  const s0 = await samples();
  expect(s0, "samples in the chart").toBeGreaterThanOrEqual(1);
  await page.waitForFunction((n) => Number(document.querySelector("[data-testid=history-summary]")?.dataset.samples) > n, s0, { timeout: 15000 });
  figures.history = `${history.queues.length} queues, ${s0} samples each when the page opened, then ${await samples()}`;
  await page.selectOption("#q-metric", "lent_gpus");
  await page.locator(".uplot").waitFor();
  const first = page.getByRole("button", { name: /Show pending jobs of/ }).first();
  await first.click();
  await page.getByRole("heading", { name: /Pending jobs of/ }).waitFor();
  await page.waitForTimeout(2500);
  await axe(page, "queues");
  await shot(page, "queues");
});

test("researcher (viewer) finds why a pod is pending", async ({ viewerPage: page }) => {
  await go(page, "jobs", "#job-q");
  // A pending gang that was attempted, found through the API (the researcher's own view is
  // then checked in the page); its first pod is `<job>-0`. One placed meanwhile is skipped.
  let job = null;
  for (let attempt = 0; attempt < 20 && job === null; attempt++) {
    const recent = await api(VIEWER, `/api/decisions?from_ms=${Date.now() - 60000}&limit=10000`);
    const gangs = [...new Set(recent.filter((r) => r.explanation.pods > 1 && r.explanation.outcome.kind === "pending").map((r) => r.explanation.job))].reverse();
    for (const candidate of gangs.slice(0, 5)) {
      const e = await api(VIEWER, `/api/explain/${encodeURIComponent(`${candidate}-0`)}`);
      if (e.state !== "pending" || !e.latest) continue;
      await page.getByLabel("Job or pod name").fill(`${candidate}-0`);
      await page.getByRole("button", { name: "Explain this name" }).click();
      try {
        await page.getByRole("heading", { name: "Why pending now" }).waitFor({ timeout: 5000 });
        await page.getByText("Nodes rejected, per policy and reason").waitFor({ timeout: 2000 });
        job = candidate;
        break;
      } catch {
        await go(page, "jobs", "#job-q");
      }
    }
    if (job === null) await page.waitForTimeout(1000);
  }
  expect(job, "a pending gang explained within 20 tries").not.toBeNull();
  const why = await page.getByTestId("why").innerText();
  const waiting = await page.getByTestId("waiting-for").innerText();
  expect(why.length > 10 && waiting.length > 5, `why: ${why} / waiting for: ${waiting}`).toBe(true);
  const heading = await page.locator("#detail-title").innerText();
  expect(heading, "the detail heading").toMatch(new RegExp(`^pod ${literal(job)}-0`));
  figures.why_pending_example = `${job}-0: ${why}`;
  await page.getByText("Nodes rejected, per policy and reason").waitFor();
  await axe(page, "jobs");
  await shot(page, "jobs");
});

test("researcher sees when a pending job will start, and what would start it sooner", async ({ viewerPage: page }) => {
  // The planner estimates the jobs nearest the front of their queues; take one it has estimated.
  // Each forecast reaches the jobs its bounded runs got to, so a job far down its queue may
  // lose its estimate to the next forecast before the page opens, and any job may start before
  // its what-if is asked (then the server says it is no longer pending): such a job is
  // skipped, and one of the tries must show its estimate and its what-if rows.
  let job = null;
  let text = "";
  let answers = [];
  const skipped = { lost_estimate: 0, started: 0 };
  const estimate = page.getByTestId("estimate");
  const rows = page.locator("table[aria-label='What-if variations'] tbody tr");
  const refusal = page.locator(".card p.error[role='alert']");
  for (let attempt = 0; attempt < 20 && job === null; attempt++) {
    const pending = await api(VIEWER, "/api/jobs?state=pending&limit=10000");
    // Soonest first among those not expected for two minutes (likely still pending when the
    // what-if is asked), then one expected later than now (it shows the interval), then any.
    const now = Date.now();
    const later = pending.filter((r) => r.estimate && r.estimate.p10_ms > now + 120000).sort((a, b) => a.estimate.p10_ms - b.estimate.p10_ms);
    const candidate = (later[0] ?? pending.find((r) => r.estimate && r.estimate.p90_ms > now + 60000) ?? pending.find((r) => r.estimate))?.name ?? null;
    if (candidate === null) {
      await page.waitForTimeout(1000);
      continue;
    }
    await go(page, `jobs?name=${encodeURIComponent(candidate)}`, "#job-q");
    try {
      await estimate.waitFor({ timeout: 5000 });
    } catch {
      skipped.lost_estimate++;
      continue;
    }
    text = await estimate.innerText();
    expect(text, "the estimate").toMatch(/expected to start in about .+, 90% within |expected to start at one of its next attempts|room for it is free now|expected start passed .+ ago without it starting/i);
    const timeline = await page.getByTestId("start-timeline").getAttribute("aria-label");
    expect(timeline ?? "", "the timeline's label").toMatch(/^Start expected between .+ and .+, most likely about /);
    await page.getByRole("button", { name: "Start sooner with…" }).click();
    // The server answers within its 20 s (the loop's cycle, then a forecast per variation, the
    // slow ones listed unanswered) or says why not: wait for either.
    await rows.first().or(refusal).waitFor({ timeout: 30000 });
    const refused = (await refusal.allTextContents()).join(" ");
    if (/no pending job is named/.test(refused)) {
      skipped.started++;
      continue;
    }
    expect(refused, "the what-if's refusal").toBe("");
    answers = await rows.allTextContents();
    job = candidate;
  }
  expect(job, `a pending job whose page shows its estimate and what-if within 20 tries (skipped: ${JSON.stringify(skipped)})`).not.toBeNull();
  figures.estimate_example = `${job}: ${text} (skipped: ${skipped.lost_estimate} lost their estimate before the page opened, ${skipped.started} started before the what-if)`;
  // The job as submitted, then at least one variation (another queue, half the GPUs per pod, …).
  expect(answers.length >= 2 && answers[0].startsWith("as submitted"), `what-if rows: ${answers.join(" | ")}`).toBe(true);
  figures.what_if_rows = answers.length;
  await axe(page, "jobs-estimate");
  await shot(page, "jobs-estimate");
});

test("researcher opens Jobs on the pending jobs, clicks the first and gets its explanation", async ({ viewerPage: page }) => {
  const rows = page.locator("table[aria-label='Matching jobs'] tbody tr");
  await go(page, "jobs", "table[aria-label='Matching jobs'] tbody tr");
  // Every pending job listed shows when it starts, or says why there is no estimate.
  const starts = await rows.evaluateAll((trs) => trs
    .filter((tr) => tr.children[2]?.textContent === "pending")
    .map((tr) => [tr.children[0]?.textContent ?? "", tr.querySelector("td[data-col='start']")?.textContent?.trim() ?? ""]));
  const bare = starts.filter(([, start]) => start === "" || start === "—");
  expect(bare.map(([job]) => job), `pending jobs listed with neither an estimate nor a reason (of ${starts.length})`).toEqual([]);
  figures.listed_estimates = `${starts.filter(([, s]) => s.startsWith("in about") || s.startsWith("at its")).length} of ${starts.length} listed pending jobs with an estimate ahead, the rest overdue or with a reason`;
  const first = rows.first();
  const state = await first.locator("td").nth(2).innerText();
  expect(state, `first row: ${await first.innerText()}`).toBe("pending");
  const name = await first.locator("a").innerText();
  await first.locator("a").click();
  await page.locator("#detail-title").waitFor({ timeout: 10000 });
  const heading = await page.locator("#detail-title").innerText();
  expect(heading.startsWith(`job ${name}`), `the detail heading "${heading}" names job ${name}`).toBe(true);
  const why = await page.getByTestId("why").innerText();
  expect(why.length, `why: ${why}`).toBeGreaterThan(10);
  const body = await page.locator("body").innerText();
  expect(body, "the page never says not found").not.toMatch(/not found/i);
  figures.first_pending_job = `${name}: ${why}`;
});

test("a job placed and then preempted shows both, in order", async ({ viewerPage: page }) => {
  // The queues reclaim quota lent to others (ui-test.sh serves the demo's cluster so), so
  // under this load some jobs are preempted.
  let job = null;
  for (let attempt = 0; attempt < 30 && job === null; attempt++) {
    const recent = await api(VIEWER, "/api/decisions?limit=10000");
    const victims = [...new Set(recent.flatMap((r) => r.explanation.preempted).filter((v) => !v.startsWith("balloon")))];
    for (const victim of victims.slice(-5)) {
      const e = await api(VIEWER, `/api/explain/${encodeURIComponent(victim)}`);
      if (e.history?.some((h) => h.kind === "preempted")) { job = victim; break; }
    }
    if (job === null) await page.waitForTimeout(1000);
  }
  expect(job, "a job preempted within 30 s").not.toBeNull();
  await go(page, `jobs?name=${encodeURIComponent(job)}`, "[data-testid=job-history] li");
  const kinds = await page.locator("[data-testid=job-history] li").evaluateAll((items) => items.map((li) => li.dataset.kind));
  const placed = kinds.indexOf("placed");
  const preempted = kinds.indexOf("preempted");
  expect(placed >= 0 && preempted > placed, `history of ${job}: ${kinds.join(", ")}`).toBe(true);
  const text = await page.getByTestId("job-history").innerText();
  expect(text, "the history names who preempted it").toMatch(/preempted to make room for \S+/);
  figures.preempted_history = `${job}: ${text.replace(/\n/g, " | ")}`;
  await axe(page, "jobs-history");
  await shot(page, "jobs-history");
});

/** The heatmap's colour of each lifecycle state, as web/src/health.tsx paints it. */
const STATE_RGB = {
  preflight: [0x7b, 0x2c, 0xbf], suspect: [0xff, 0x88, 0x00], draining: [0xe5, 0x38, 0x3b],
  repair: [0xa4, 0x16, 0x1a], retest: [0xc7, 0x7d, 0xff], retired: [0x1b, 0x1b, 0x1b],
};
/** Pixels of the heatmap's canvas painted exactly `rgb`. */
const painted = (page, rgb) => page.evaluate(([r, g, b]) => {
  const canvas = document.querySelector("canvas.heatmap");
  const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) if (px[i] === r && px[i + 1] === g && px[i + 2] === b) n++;
  return n;
}, rgb);

test("cluster: the heatmap colours nodes by lifecycle state, with a legend, a State filter and a node's health history", async ({ viewerPage: page }) => {
  // ui-test.sh fails a node every few seconds: nodes out of Ready show within a minute.
  let out = [];
  await expect.poll(async () => {
    const cols = await api(VIEWER, "/api/cluster/nodes");
    out = cols.name.map((name, i) => [name, cols.state[i]]).filter(([, st]) => st !== "ready");
    return out.length;
  }, { message: "nodes out of Ready", timeout: 90_000 }).toBeGreaterThan(0);
  await page.goto(`${BASE}/#/cluster`);
  await page.waitForFunction(() => (window.__gantryCluster?.draws.length ?? 0) > 0, null, { timeout: 15000 });
  // The legend names every state, each with a count; they add up to the fleet.
  const legend = page.getByTestId("state-legend");
  const items = await legend.locator("li[data-state]").evaluateAll((lis) => lis.map((li) => [li.dataset.state, li.textContent, Number(li.querySelector("[data-count]").textContent.replace(/,/g, ""))]));
  expect(items.map(([st]) => st), "states in the legend").toEqual(["preflight", "ready", "suspect", "draining", "repair", "retest", "retired", "other"]);
  for (const [st, text] of items) expect(text, `legend of ${st}`).toMatch(/^(Preflight|Ready|Suspect|Draining|Repair|Re-test|Retired|Ready but)/);
  const counted = items.filter(([st]) => st !== "other").reduce((a, [, , n]) => a + n, 0);
  expect(counted, "the legend's counts cover every node").toBe(7500);
  // The most common state out of Ready is on the canvas in its colour (a node stays in
  // Repair for minutes, so the next draw still has it).
  const [busiest, many] = items.filter(([st]) => st in STATE_RGB).sort((a, b) => b[2] - a[2]).map(([st, , n]) => [st, n])[0];
  expect(many, `nodes in ${busiest}, the commonest state out of Ready`).toBeGreaterThan(0);
  expect(await painted(page, STATE_RGB[busiest]), `pixels of ${busiest}'s colour`).toBeGreaterThan(0);
  figures.lifecycle_states = items.map(([st, , n]) => `${st} ${n}`).join(", ");
  // The State filter greys out every other node: no occupancy shade is left.
  await page.selectOption("#f-state", busiest);
  await page.waitForFunction(() => /nodes match the filters/.test(document.querySelector("main")?.textContent ?? ""));
  await page.waitForTimeout(1200);
  expect(await painted(page, STATE_RGB[busiest]), `pixels of ${busiest} with the filter on it`).toBeGreaterThan(0);
  expect(await painted(page, [0x21, 0x71, 0xb5]), "pixels of a busy Ready node with the filter on another state").toBe(0);
  // A node that failed: its page shows its state and its steps, with their causes.
  const [failed] = out.find(([, st]) => st === "repair" || st === "suspect") ?? out[0];
  await page.fill("#node-name", failed);
  await page.getByRole("button", { name: "Open", exact: true }).click();
  await page.getByRole("heading", { name: `Node ${failed}`, exact: true }).waitFor();
  await expect(page.getByTestId("node-state")).toHaveText(/^Lifecycle state: (Preflight|Ready|Suspect|Draining|Repair|Re-test|Retired)\.$/);
  const steps = page.getByTestId("node-health-history").locator("tbody tr");
  await steps.first().waitFor();
  const rows = await steps.evaluateAll((trs) => trs.map((tr) => [tr.dataset.to, tr.textContent]));
  const cordon = rows.find(([to]) => to === "suspect");
  expect(cordon, `${failed}'s steps: ${rows.map(([, t]) => t).join(" | ")}`).toBeTruthy();
  expect(cordon[1], "the cordon's step names what the node reported").toMatch(/(ago|just now)Ready → Suspect.+\S/);
  expect(await steps.first().locator("time").getAttribute("title"), "the clock time on hover").toBeTruthy();
  figures.node_health = `${failed}: ${rows.map(([, t]) => t).join(" | ")}`;
  await page.selectOption("#f-state", "");
  await axe(page, "cluster-states");
  await shot(page, "cluster-states");
});

test("a job a node failure restarted says which node, what it reported, and how long it avoids it", async ({ viewerPage: page }) => {
  let restarted = [];
  await expect.poll(async () => {
    restarted = await api(VIEWER, "/api/jobs?restarted=true&limit=10000");
    return restarted.length;
  }, { message: "jobs restarted by a node failure", timeout: 90_000 }).toBeGreaterThan(0);
  // The Jobs page lists them alone with the filter, each marked.
  await go(page, "jobs", "#job-q");
  await page.getByLabel("Only jobs a node failure restarted").check();
  // The list reloads with the filter: every row is then marked.
  const rows = page.locator("table[aria-label='Matching jobs'] tbody tr");
  let marks = [];
  await expect.poll(async () => {
    marks = await rows.evaluateAll((trs) => trs.map((tr) => tr.children[0]?.querySelector(".badge")?.textContent === "restarted"));
    return marks.length > 0 && marks.every(Boolean);
  }, { message: "every row of the filtered list marked restarted" }).toBe(true);
  // The most recent restart, so it is still pending or running when its page opens.
  const newest = (r) => Math.max(...r.avoiding.map((b) => b.at_ms));
  const job = restarted.sort((a, b) => newest(b) - newest(a))[0];
  const bad = job.avoiding.at(-1);
  await go(page, `jobs?name=${encodeURIComponent(job.name)}`, "[data-testid=restart]");
  const line = page.getByTestId("restart").locator(`p[data-node="${bad.node}"]`);
  const text = await line.innerText();
  expect(text, `${job.name}'s restart reason`).toMatch(new RegExp(
    `^Restarted after ${literal(bad.node)} reported ${literal(bad.cause)} (\\d+ (s|min) ago|just now|\\d+ h \\d+ min ago); avoiding ${literal(bad.node)} for (\\d+ (s|min)|\\d+ h \\d+ min) more\\.$`));
  const titles = await line.locator("time").evaluateAll((ts) => ts.map((t) => t.getAttribute("title")));
  expect(titles.length === 2 && titles.every(Boolean) && titles[1].startsWith("until "), `clock times on hover: ${titles.join(" | ")}`).toBe(true);
  figures.restarted_job = `${job.name} (${job.state}): ${text}`;
  await axe(page, "jobs-restarted");
  await shot(page, "jobs-restarted");
});

/** Serves GET /api/health with the real answer but a tripped breaker while `tripped()`. */
async function trippedBreaker(page, tripped) {
  await page.route((url) => url.pathname === "/api/health", async (route) => {
    const real = await route.fetch();
    const body = await real.json();
    if (tripped()) {
      body.breaker = { tripped: true, tripped_at_ms: Date.now() - 7 * 60_000, held: 12,
        reason: "one more cordon would put 751 of 7500 nodes out, over the 10% cap" };
    }
    await route.fulfill({ response: real, json: body });
  });
}

test("breaker: an admin sees it tripped, with why, and resets it; a viewer sees it without a Reset (mocked trip)", async ({ adminPage: page, viewerPage }) => {
  // The real breaker first: not tripped in the demo (ui-test.sh raises its hourly cap), and
  // the page says so.
  await go(page, "cluster", "[data-testid=breaker-closed]");
  expect(await page.getByTestId("breaker-banner").count(), "a banner while the breaker is closed").toBe(0);
  // The server's own answers to a reset: a viewer is refused, an admin told there is nothing.
  const reset = (token) => fetch(`${BASE}/api/health/reset`, { method: "POST", headers: { Authorization: `Bearer ${token}` } });
  const refused = await reset(VIEWER);
  expect(refused.status, "a viewer's POST /api/health/reset").toBe(403);
  const nothing = await reset(ADMIN);
  expect([nothing.status, (await nothing.json()).error], "an admin's reset with nothing tripped")
    .toEqual([409, "the breaker is not tripped: automated cordons go ahead, and there is nothing to reset"]);
  // A real trip needs 10% of the fleet out at once, which the demo never does: the browser is
  // shown one by intercepting GET /api/health, and the reset's POST answered as the server
  // answers a real one.
  let tripped = true;
  await trippedBreaker(page, () => tripped);
  let posted = 0;
  await page.route((url) => url.pathname === "/api/health/reset", async (route) => {
    posted++;
    tripped = false;
    const now = Date.now();
    await route.fulfill({ json: { tripped_at_ms: now - 7 * 60_000, reason: "one more cordon would put 751 of 7500 nodes out, over the 10% cap", held: 12, reset_at_ms: now, by: "alice" } });
  });
  await go(page, "queues", "[data-testid=breaker-banner]");
  const banner = page.getByTestId("breaker-banner");
  await expect(banner, "the banner on another page").toContainText("Node health breaker tripped 7 min ago: one more cordon would put 751 of 7500 nodes out, over the 10% cap.");
  await expect(banner).toContainText("12 failure signals held so far");
  await axe(page, "breaker-banner");
  await shot(page, "breaker-banner");
  await banner.getByRole("button", { name: "Reset breaker" }).click();
  await page.getByRole("dialog").getByRole("button", { name: "Confirm" }).click();
  await expect(page.getByText(/^Breaker reset by alice: it had tripped 7 min before/)).toBeVisible();
  expect(posted, "reset requests").toBe(1);
  await expect(banner, "the banner once reset").toHaveCount(0);

  await trippedBreaker(viewerPage, () => true);
  await go(viewerPage, "jobs", "[data-testid=breaker-banner]");
  await expect(viewerPage.getByTestId("breaker-banner")).toContainText("An admin can reset it.");
  expect(await viewerPage.getByRole("button", { name: /reset/i }).count(), "Reset buttons a viewer sees").toBe(0);
});

test("viewer sees no mutating control anywhere", async ({ viewerPage: page }) => {
  for (const [hash, ready] of [["policies", "text=Policy set versions"], ["cluster", "canvas"], ["queues", "td"], ["jobs", "#job-q"], ["feed", "text=decisions received"]]) {
    await go(page, hash, ready);
    await page.waitForTimeout(hash === "policies" ? 1500 : 300);
    const mutating = await page.locator("button, input[type=file], textarea").evaluateAll((els) =>
      els.map((e) => e.textContent || e.getAttribute("type") || e.tagName)
        .filter((t) => /activate|roll back|shadow|upload|validate|reset|file|textarea/i.test(t)));
    expect(mutating, `mutating controls on ${hash}`).toEqual([]);
  }
  await go(page, "policies", "text=Policy set versions");
  // What runs now, and whether any policy is quarantined.
  // The table appears once /api/sets has answered; wait for it rather than read a half-loaded page.
  const rows = page.locator("h2:has-text('Running now') + table tbody tr");
  await rows.first().waitFor({ timeout: 10000 }).catch(() => {});
  const running = await rows.allTextContents();
  expect(running.length === 3 && running.every((row) => row.includes("healthy")), `running policies: ${running.join(" | ")}`).toBe(true);
  // The audit log is admin-only: a viewer's page neither shows nor asks for it.
  expect(await page.locator("table[aria-label='Audit trail']").count(), "audit trail tables a viewer sees").toBe(0);
  const refused = await fetch(`${BASE}/api/audit`, { headers: { Authorization: `Bearer ${VIEWER}` } });
  expect(refused.status, "a viewer's GET /api/audit").toBe(403);
  await axe(page, "policies-viewer");
  await shot(page, "policies-viewer");
});

test("admin uploads keep-off, shadows it, activates it, sees placements leave the kept-off nodes in the feed, rolls back", async ({ adminPage: page }) => {
  // Its waits add up to about 10 minutes at worst (placements 90 + 120 s, shadow 150 s,
  // placements back on v1 150 s, the rest seconds each).
  test.setTimeout(12 * 60_000);
  const confirm = async () => {
    await page.locator("dialog[open]").getByRole("button", { name: "Confirm" }).click();
    await page.locator("dialog[open]").waitFor({ state: "detached", timeout: 5000 }).catch(() => {});
  };
  // The feed's placements (newest first) under one set version, each as its list of nodes.
  const placements = (set) => page.locator(`li[data-set="${set}"][data-placed="yes"]`)
    .evaluateAll((els) => els.map((e) => (e.dataset.nodes ?? "").split(" ").filter(Boolean)));
  const feed = async () => {
    await go(page, "feed", "text=decisions received");
    await page.getByLabel("Placements only").check();
    // Balloons' placements too, which the policies decide like any other.
    await page.getByLabel("Show balloons").check();
  };
  const waitPlacements = async (set, n, timeout) => {
    await page.waitForFunction(([set, n]) => document.querySelectorAll(`li[data-set="${set}"][data-placed="yes"]`).length >= n, [set, n], { timeout });
  };

  // 1. Under v1, the feed shows where placements go. Keep-off is configured with the two name
  //    prefixes (e.g. `a100-3`: a100-3, a100-30…39, a100-300…399, a100-3000…3999) that the
  //    most of them used, about 30% of the nodes, and two more exact names. On a full cluster
  //    placements are few (jobs end 30 s to 5 min after they start), so the kept-off share is
  //    large enough for the shadow run to meet some of them within a minute or two.
  await test.step("v1: where the feed's placements go", async () => {
    await feed();
    await waitPlacements(1, 20, 90000);
  });
  const before = await placements(1);
  const prefixOf = (node) => node.replace(/^(.*-\d).*$/, "$1");
  const counts = new Map();
  for (const node of before.flat()) counts.set(prefixOf(node), (counts.get(prefixOf(node)) ?? 0) + 1);
  const prefixes = [...counts.entries()].sort((a, b) => b[1] - a[1]).slice(0, 2).map(([p]) => p);
  const byPrefix = (node) => prefixes.some((p) => node.startsWith(p));
  const exact = [...new Set(before.flat())].filter((n) => !byPrefix(n)).slice(0, 2);
  const keptOff = (node) => byPrefix(node) || exact.includes(node);
  const onKeptOff = (list) => list.filter((nodes) => nodes.some(keptOff)).length;
  const config = JSON.stringify({ nodes: exact, prefixes });
  figures.keep_off_config = config;
  figures.v1_placements_on_kept_off = `${onKeptOff(before)} of ${before.length}`;
  expect(onKeptOff(before), "placements under v1 on the chosen nodes").toBeGreaterThan(0);

  // 2. Upload keep-off with that config (validated first): the UI makes a new set version of
  //    the active set's policies plus keep-off.
  const v = await test.step("upload keep-off, validated first", async () => {
    await go(page, "policies", "#wasm");
    const activeBefore = await page.locator("td", { hasText: "(active)" }).innerText();
    await page.setInputFiles("#wasm", join(PLUGINS, "keep_off.wasm"));
    await page.getByLabel("Config (JSON)").fill(config);
    await page.getByRole("button", { name: "Validate" }).click();
    const validation = await page.getByTestId("validation").innerText({ timeout: 30000 });
    expect(/keep-off/.test(validation) && /node is kept off by policy config/.test(validation), `validation: ${validation}`).toBe(true);
    figures.keep_off_self_test = validation.replace(/.*Self-test: /s, "").trim();
    await page.getByRole("button", { name: "Upload and create a set version" }).click();
    await confirm();
    const created = await page.locator("p.ok").innerText({ timeout: 30000 });
    const v = Number(/policy set v(\d+)/.exec(created)?.[1]);
    expect(v >= 2, `upload result: ${created}`).toBe(true);
    const setRow = await page.locator("tr", { has: page.locator("td", { hasText: new RegExp(`^v${v}$`) }) }).innerText();
    expect(setRow, `set v${v}`).toMatch(/keep-off/);
    figures.sets = `${activeBefore.trim()} → v${v}: ${setRow.split("\t")[1] ?? setRow}`;
    return v;
  });

  // 3. Shadow: the candidate would put pods elsewhere; the report shows disagreements.
  await test.step(`shadow v${v} until the report shows disagreements`, async () => {
    await page.getByRole("button", { name: `Shadow v${v}` }).click();
    await confirm();
    const report = page.getByTestId("shadow-report");
    await report.waitFor({ timeout: 15000 });
    await page.waitForFunction(() => Number(document.querySelector("[data-testid=shadow-report]")?.dataset.disagreements) > 0, null, { timeout: 150000 });
    figures.shadow = (await report.locator("p").first().innerText()).trim();
    await page.locator("table[aria-label='Recent disagreements'] tbody tr").first().waitFor();
    await axe(page, "policies-admin");
    await shot(page, "policies-admin");
  });

  // 4. Activate: from now on no placement lands on a kept-off node.
  await test.step(`activate v${v}: no placement on a kept-off node`, async () => {
    await page.getByRole("button", { name: `Activate v${v}` }).click();
    await confirm();
    await page.getByText(`Policy set v${v} is active.`).waitFor({ timeout: 15000 });
    await feed();
    await waitPlacements(v, 10, 120000);
    const after = await placements(v);
    figures.v_placements_on_kept_off = `${onKeptOff(after)} of ${after.length} (set v${v})`;
    expect(onKeptOff(after), `placements under v${v} on kept-off nodes: ${JSON.stringify(after.filter((n) => n.some(keptOff)).slice(0, 3))}`).toBe(0);
    figures.feed_after_activation = await page.locator(`li[data-set="${v}"][data-placed="yes"]`).first().innerText();
    await axe(page, "feed");
    await shot(page, "feed");
  });

  // 5. Roll back to v1: placements return to the kept-off nodes.
  await test.step("roll back to v1: placements return to the kept-off nodes", async () => {
    await go(page, "policies", "text=Policy set versions");
    await page.getByRole("button", { name: /^Roll back to v1$/ }).click();
    await confirm();
    await page.getByText("Rolled back to policy set v1.").waitFor({ timeout: 15000 });
    await feed();
    await page.waitForFunction((prefixes) => [...document.querySelectorAll(`li[data-set="1"][data-placed="yes"]`)]
      .some((li) => (li.dataset.nodes ?? "").split(" ").some((n) => prefixes.some((p) => n.startsWith(p)))), prefixes, { timeout: 150000 });
    const resumed = await placements(1);
    figures.v1_after_rollback_on_kept_off = `${onKeptOff(resumed)} of ${resumed.length}`;
  });
  await go(page, "policies", "text=Audit trail");
  // The heading shows before the entries arrive: wait for the rows, then check them.
  const auditRows = page.locator("table[aria-label='Audit trail'] tbody tr");
  await auditRows.first().waitFor({ timeout: 15000 });
  const audit = await page.locator("table[aria-label='Audit trail']").innerText();
  expect(/set\.activate/.test(audit) && /set\.rollback/.test(audit) && /shadow\.start/.test(audit),
    `the audit trail shows the shadow run, the activation and the rollback: ${audit.slice(0, 400)}`).toBe(true);
});

test("admin composes a set in the UI: gpu-binpack with its own config and a 500 ms deadline", async ({ adminPage: page }) => {
  const [before, stored] = [await api(ADMIN, "/api/sets"), await api(ADMIN, "/api/policies")];
  const base = before.sets.find((s) => s.version === before.active);
  const i = base.entries.findIndex((e) => stored.find((m) => m.sha256 === e.sha256)?.name === "gpu-binpack");
  expect(i, `the index of gpu-binpack in v${before.active}`).toBeGreaterThanOrEqual(0);
  await go(page, "policies", "#compose-from");
  const config = '{"node_weight": 1, "domain_weight": 60}';
  await page.getByLabel(`Config of entry ${i + 1}`).fill(config);
  await page.getByLabel(`Deadline of entry ${i + 1}`).fill("500");
  await page.locator("#compose-note").fill("binpack by domain, 500 ms");
  await page.getByRole("button", { name: "Create set version" }).click();
  await page.locator("dialog[open]").getByRole("button", { name: "Confirm" }).click();
  const ok = await page.getByRole("status").filter({ hasText: /Created policy set v\d+/ }).innerText({ timeout: 10000 });
  const after = await api(ADMIN, "/api/sets");
  const made = after.sets[after.sets.length - 1];
  expect(ok.includes(`v${made.version}`) && made.version > before.sets.length, `${ok} / ${JSON.stringify(made)}`).toBe(true);
  expect(made.entries[i].config === config && made.entries[i].deadline_ms === 500, JSON.stringify(made.entries[i])).toBe(true);
  expect(made.entries.every((e, k) => k === i || JSON.stringify(e) === JSON.stringify(base.entries[k])), JSON.stringify(made.entries)).toBe(true);
  expect(made.note === "binpack by domain, 500 ms" && after.active === before.active, JSON.stringify(made)).toBe(true);
  figures.composed = `v${made.version} from v${before.active}: ${made.entries.length} entries, gpu-binpack config ${made.entries[i].config}, deadline ${made.entries[i].deadline_ms} ms`;
  await axe(page, "policies-compose");
});
