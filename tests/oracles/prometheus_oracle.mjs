// Parses a Prometheus text exposition (version 0.0.4) with parse-prometheus-text-format, a parser
// nobody here wrote, for tests/e2e.
//
//   node prometheus_oracle.mjs metrics.txt
//
// Prints {ok: true, families, samples} or {ok: false, error} when the text does not parse.
//   families: the parser's own output: [{name, help, type, metrics}].
//   samples:  every sample line as the parser read it: [{name, labels, value}].
// The parser folds a histogram's _bucket, _sum and _count lines into one object only when the
// histogram has no label but `le` (a labelled one loses its sum and count), so the samples come
// from a second parse of the same text with every family typed untyped: there each line stays a
// sample of its own, its name, labels (unescaped) and value read by the same parser. The parser
// takes a malformed value or an unterminated label quietly (as an empty or odd value string), so
// each value must also be a float as the format spells it.
import { readFileSync } from 'node:fs';
import parsePrometheusTextFormat from 'parse-prometheus-text-format';

const text = readFileSync(process.argv[2], 'utf8');
try {
  const families = parsePrometheusTextFormat(text);
  const untyped = text.replace(/^# TYPE (\S+) \S+$/gm, '# TYPE $1 untyped');
  const float = /^[+-]?(Inf|NaN|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?)$/;
  const samples = [];
  for (const family of parsePrometheusTextFormat(untyped)) {
    for (const metric of family.metrics) {
      if (!float.test(metric.value)) {
        throw new Error(`sample ${family.name}${JSON.stringify(metric.labels ?? {})}: value '${metric.value}' is not a float`);
      }
      const value = metric.value.replace(/Inf$/, 'Infinity');
      samples.push({ name: family.name, labels: metric.labels ?? {}, value: Number(value) });
    }
  }
  console.log(JSON.stringify({ ok: true, families, samples }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, error: String(error && error.message ? error.message : error) }));
}
