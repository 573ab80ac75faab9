// Renders chat templates with @huggingface/jinja, the reference the C++ Jinja subset is checked
// against. Reads one JSON document from stdin: an array of cases {template, context}; writes an
// array of results {ok: true, output} or {ok: false, error} (the thrown error's message) to stdout.
import { Template } from "@huggingface/jinja";

let input = "";
process.stdin.setEncoding("utf8");
for await (const chunk of process.stdin) input += chunk;

const cases = JSON.parse(input);
const parsed = new Map(); // template source -> Template or the parse error
const results = cases.map(({ template, context }) => {
  try {
    if (!parsed.has(template)) {
      try {
        parsed.set(template, new Template(template));
      } catch (e) {
        parsed.set(template, e);
      }
    }
    const t = parsed.get(template);
    if (t instanceof Error) throw t;
    return { ok: true, output: t.render(context) };
  } catch (e) {
    return { ok: false, error: String(e && e.message !== undefined ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(results));
