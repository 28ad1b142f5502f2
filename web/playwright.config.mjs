// Playwright configuration of the browser tests (tests/ui.spec.mjs), run by scripts/ui-test.sh
// against a real `gantry serve` it has started. Everything the run leaves goes under
// $UI_ARTIFACTS: the page screenshots and results.json (written by the tests), report.json
// (the JSON reporter, which ui-test.sh counts), html-report/ and, per failed test, its trace
// and screenshot in test-results/.
import { defineConfig } from "@playwright/test";
import { join, resolve } from "node:path";

if (!process.env.UI_ARTIFACTS) throw new Error("UI_ARTIFACTS is not set (scripts/ui-test.sh sets it)");
const artifacts = resolve(process.env.UI_ARTIFACTS);

export default defineConfig({
  testDir: "tests",
  // One server for the whole run, and order matters: the viewer's checks expect the initial
  // policy set; the admin's round trip activates a set and rolls it back, and the composer
  // starts from whatever is active then. A failed test does not stop the rest.
  workers: 1,
  fullyParallel: false,
  // No retries: the suite measures a live, loaded system, and a retry that passes would hide
  // exactly the flakiness it is there to show.
  retries: 0,
  forbidOnly: true,
  // Most checks take seconds; the admin's round trip sets its own, longer timeout (it waits up
  // to minutes for placements in the feed and for the shadow report).
  timeout: 3 * 60_000,
  globalTimeout: 30 * 60_000,
  expect: { timeout: 10_000 },
  outputDir: join(artifacts, "test-results"),
  reporter: [
    ["list"],
    ["json", { outputFile: join(artifacts, "report.json") }],
    ["html", { open: "never", outputFolder: join(artifacts, "html-report") }],
  ],
  use: {
    browserName: "chromium",
    headless: true,
    // Debian's Chromium, not a browser downloaded by Playwright.
    launchOptions: {
      executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
      args: ["--no-sandbox", "--disable-dev-shm-usage"],
    },
    viewport: { width: 1400, height: 1000 },
    // As with playwright-core alone (the suite's earlier runner): an action or a wait without
    // its own timeout gives up after 30 s rather than running into the test's timeout.
    actionTimeout: 30_000,
    navigationTimeout: 30_000,
    trace: "retain-on-failure",
    screenshot: "only-on-failure",
  },
});
