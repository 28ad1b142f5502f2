import { defineConfig } from "vite";

// One small bundle with no external requests: the binary embeds dist/ and must work offline.
// scripts/ui-build.sh builds into a scratch folder (GANTRY_UI_OUT_DIR) and copies into dist/
// only what changed, so that an unchanged UI does not rebuild the server.
export default defineConfig({
  base: "/",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: { outDir: process.env.GANTRY_UI_OUT_DIR ?? "dist", emptyOutDir: true, target: "es2022", assetsInlineLimit: 0, chunkSizeWarningLimit: 400 },
});
