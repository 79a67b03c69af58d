// Builds dist/: ESM + .d.ts (tsc), CommonJS (esbuild) with its .d.cts, and the minified
// browser bundle (ESM, one file) that the chat page loads: copied to ../../app/static/hubbub.js,
// so the page and npm users run the same client. Deterministic: the same sources give the
// same bytes (tests/test_sdk_js.py checks that the committed bundle is the built one).
import { execFileSync } from "node:child_process";
import { copyFileSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { build } from "esbuild";

rmSync("dist", { recursive: true, force: true });
execFileSync(process.execPath, ["node_modules/typescript/bin/tsc", "-p", "tsconfig.json"], { stdio: "inherit" });
const version = JSON.parse(readFileSync("package.json", "utf8")).version;
const banner = `// hubbub-client ${version}: built from clients/js by \`npm run build\`; do not edit.`;
await build({
  entryPoints: ["src/index.ts"], bundle: true, format: "cjs", platform: "neutral",
  target: "es2022", outfile: "dist/index.cjs", banner: { js: banner }, logLevel: "warning",
});
// The CommonJS entry's types: the same declarations, importing each other as .cjs.
for (const name of ["index", "client", "frames"]) {
  const declarations = readFileSync(`dist/${name}.d.ts`, "utf8");
  writeFileSync(`dist/${name}.d.cts`, declarations.replaceAll('.js";', '.cjs";'));
}
await build({
  entryPoints: ["src/index.ts"], bundle: true, format: "esm", platform: "browser",
  target: "es2022", minify: true, outfile: "dist/hubbub.min.js", banner: { js: banner },
  legalComments: "none", logLevel: "warning",
});
// HUBBUB_BUNDLE_OUT: elsewhere (the test that compares a fresh build with the committed one).
copyFileSync("dist/hubbub.min.js", process.env.HUBBUB_BUNDLE_OUT ?? "../../app/static/hubbub.js");
