import { defineConfig } from "vite";

// One small bundle with no external requests: the binary embeds dist/ and must work offline.
export default defineConfig({
  base: "/",
  esbuild: { jsx: "automatic", jsxImportSource: "preact" },
  build: { outDir: "dist", emptyOutDir: true, target: "es2022", assetsInlineLimit: 0, chunkSizeWarningLimit: 400 },
});
