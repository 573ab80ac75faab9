// Judges constrained outputs with independent engines: ajv (JSON schema, with ajv-formats) and
// JavaScript's RegExp (regex and choice constraints).
// Usage: node structured_oracle.mjs CASES.json  -> prints {"results":[{"ok":bool,"why":string}...]}
// Each case: {"kind":"schema","schema":{...},"output":"..."} | {"kind":"regex","pattern":"...","output":"..."}
//          | {"kind":"choice","choices":[...],"output":"..."}
import { readFileSync } from "node:fs";
import Ajv from "ajv";
import addFormats from "ajv-formats";

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

const cases = JSON.parse(readFileSync(process.argv[2], "utf8"));
const results = cases.map((c) => {
  if (c.kind === "schema") {
    let value;
    try {
      value = JSON.parse(c.output);
    } catch (e) {
      return { ok: false, why: "not JSON: " + e.message };
    }
    const validate = ajv.compile(c.schema);
    return validate(value) ? { ok: true, why: "" } : { ok: false, why: ajv.errorsText(validate.errors) };
  }
  if (c.kind === "regex") {
    const re = new RegExp("^(?:" + c.pattern + ")$", "u");
    return re.test(c.output) ? { ok: true, why: "" } : { ok: false, why: "does not match /" + c.pattern + "/" };
  }
  if (c.kind === "choice") {
    return c.choices.includes(c.output) ? { ok: true, why: "" } : { ok: false, why: "not one of the choices" };
  }
  return { ok: false, why: "unknown case kind " + c.kind };
});
process.stdout.write(JSON.stringify({ results }));
