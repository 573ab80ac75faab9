// Loads a Chrome trace with the trace engine of Chrome DevTools' performance panel
// (@paulirish/trace_engine, the parser behind chrome://inspect and Lighthouse), for tests/e2e.
//
//   node trace_oracle.mjs trace.json
//
// Prints {ok: true, bounds, threads: [{pid, tid, name, process, spans: [{name, ts, dur, depth}]}]}
// as the engine modelled the trace (every X event it placed on a thread, with its depth in the
// thread's tree of nested spans), or {ok: false, error} when it cannot load it. The file is also
// checked against the trace-event format's rules the engine does not enforce itself: an object
// with a traceEvents array whose X events have integer pid and tid and ts, dur numbers >= 0.
import { readFileSync } from 'node:fs';
import * as TraceEngine from '@paulirish/trace_engine';

function check_format(trace) {
  if (typeof trace !== 'object' || !Array.isArray(trace.traceEvents)) throw new Error('no traceEvents array');
  for (const [i, e] of trace.traceEvents.entries()) {
    const where = `traceEvents[${i}] (${JSON.stringify(e).slice(0, 120)})`;
    if (typeof e.name !== 'string' || typeof e.ph !== 'string') throw new Error(`${where}: no name or ph`);
    if (!Number.isInteger(e.pid) || !Number.isInteger(e.tid)) throw new Error(`${where}: pid and tid must be integers`);
    if (e.ph === 'X') {
      if (typeof e.ts !== 'number' || typeof e.dur !== 'number' || e.ts < 0 || e.dur < 0) {
        throw new Error(`${where}: ts and dur must be numbers >= 0`);
      }
    } else if (e.ph === 'M') {
      if (!['process_name', 'thread_name', 'process_sort_index', 'thread_sort_index'].includes(e.name)) {
        throw new Error(`${where}: unknown metadata event`);
      }
      if (typeof e.args?.name !== 'string' && typeof e.args?.sort_index !== 'number') {
        throw new Error(`${where}: metadata without args.name`);
      }
    } else {
      throw new Error(`${where}: unexpected phase '${e.ph}'`);
    }
  }
}

try {
  const trace = JSON.parse(readFileSync(process.argv[2], 'utf8'));
  check_format(trace);
  const model = TraceEngine.TraceModel.Model.createWithAllHandlers();
  await model.parse(trace.traceEvents);
  const data = model.parsedTrace(0).data;
  const processNames = new Map();
  for (const e of trace.traceEvents) if (e.ph === 'M' && e.name === 'process_name') processNames.set(e.pid, e.args.name);
  const threads = [];
  for (const [pid, process] of data.Renderer.processes) {
    for (const [tid, thread] of process.threads) {
      const depth = new Map();
      const walk = (node, d) => {
        depth.set(node.entry, d);
        for (const child of node.children) walk(child, d + 1);
      };
      for (const root of thread.tree?.roots ?? []) walk(root, 0);
      threads.push({
        pid, tid, name: thread.name ?? null, process: processNames.get(pid) ?? null,
        spans: thread.entries.map((e) => ({ name: e.name, ts: e.ts, dur: e.dur ?? 0, depth: depth.get(e) ?? -1 })),
      });
    }
  }
  console.log(JSON.stringify({ ok: true, bounds: data.Meta.traceBounds, threads }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, error: String(error && error.stack ? error.stack : error) }));
}
