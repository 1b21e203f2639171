// The dashboard: built into dist/, which the entry point (thorn-gateway) serves at /.
// Swagger UI's files are copied beside it so /docs works offline.
import { copyFileSync, mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { defineConfig, type Plugin } from "vite";

const here = dirname(fileURLToPath(import.meta.url));

function swaggerUi(): Plugin {
  return {
    name: "thorn-swagger-ui",
    apply: "build",
    closeBundle() {
      const from = resolve(here, "node_modules/swagger-ui-dist");
      const to = resolve(here, "dist/swagger");
      mkdirSync(to, { recursive: true });
      for (const file of ["swagger-ui.css", "swagger-ui-bundle.js"]) {
        copyFileSync(resolve(from, file), resolve(to, file));
      }
    },
  };
}

export default defineConfig({
  plugins: [swaggerUi()],
  build: { outDir: "dist", emptyOutDir: true, chunkSizeWarningLimit: 1024 },
  // `npm run dev` against a running `make run`.
  server: { proxy: { "/api": "http://127.0.0.1:8080", "/openapi.json": "http://127.0.0.1:8080" } },
});
