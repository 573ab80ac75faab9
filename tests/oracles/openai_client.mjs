// Drives Troupe's HTTP API with the official `openai` npm client, for tests/e2e and bench/.
//
//   node openai_client.mjs '<plan json>'    or    node openai_client.mjs @plan.json
//
// plan: {base_url, api_key?, concurrent?: bool, requests: [{
//          api: "completions" | "chat" | "embeddings", params: {...},   // passed to create() as they are
//          drop_after_chunks?: k,                        // streaming: break off after k chunks
//        }]}
// Prints one JSON array, a result per request, in order:
//   {ok: true, choices: [{index, text, finish_reason, num_logprobs}], usage, num_chunks, dropped,
//    chunk_times_ms: [...]}      (chunk arrival times since the request was sent; streams only)
//   {ok: true, data: [{index, embedding}], usage}   (embeddings: the SDK asks for base64 and decodes it)
//   {ok: false, status, error}  (what the client threw: APIError's status and error body)
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';

const argument = process.argv[2];
const plan = JSON.parse(argument.startsWith('@') ? readFileSync(argument.slice(1), 'utf8') : argument);
const client = new OpenAI({
  baseURL: plan.base_url,
  apiKey: plan.api_key ?? 'none',
  maxRetries: 0,
  timeout: 600_000,
});

function choiceText(api, choice, streaming) {
  if (api === 'chat') return (streaming ? choice.delta?.content : choice.message?.content) ?? '';
  return choice.text ?? '';
}

function numLogprobs(api, logprobs) {
  if (!logprobs) return 0;
  return api === 'chat' ? (logprobs.content?.length ?? 0) : (logprobs.tokens?.length ?? 0);
}

async function run(request) {
  const api = request.api === 'chat' ? client.chat.completions : client.completions;
  const started = performance.now();
  if (request.api === 'embeddings') {
    try {
      const response = await client.embeddings.create(request.params);
      return {
        ok: true,
        model: response.model,
        data: response.data.map((d) => ({ index: d.index, object: d.object, embedding: Array.from(d.embedding) })),
        usage: response.usage,
      };
    } catch (e) {
      return { ok: false, status: e.status ?? null, error: e.error ?? { message: String(e) } };
    }
  }
  try {
    const response = await api.create(request.params);
    if (!request.params.stream) {
      return {
        ok: true,
        id: response.id,
        object: response.object,
        model: response.model,
        choices: response.choices.map((c) => ({
          index: c.index,
          text: choiceText(request.api, c, false),
          finish_reason: c.finish_reason,
          num_logprobs: numLogprobs(request.api, c.logprobs),
          logprobs: c.logprobs ?? null,
        })),
        usage: response.usage ?? null,
      };
    }
    const choices = new Map();
    let usage = null;
    let numChunks = 0;
    let dropped = false;
    const chunkTimes = [];
    let roles = 0;
    for await (const chunk of response) {
      numChunks += 1;
      chunkTimes.push(performance.now() - started);
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        const entry = choices.get(c.index) ?? { index: c.index, text: '', finish_reason: null, num_logprobs: 0 };
        entry.text += choiceText(request.api, c, true);
        if (c.finish_reason) entry.finish_reason = c.finish_reason;
        entry.num_logprobs += numLogprobs(request.api, c.logprobs);
        if (c.delta?.role) roles += 1;
        choices.set(c.index, entry);
      }
      if (request.drop_after_chunks !== undefined && numChunks >= request.drop_after_chunks) {
        dropped = true;
        break;  // the client aborts the request: its connection closes
      }
    }
    return {
      ok: true,
      choices: [...choices.values()].sort((a, b) => a.index - b.index),
      usage,
      num_chunks: numChunks,
      num_role_deltas: roles,
      dropped,
      chunk_times_ms: chunkTimes,
    };
  } catch (e) {
    return { ok: false, status: e.status ?? null, error: e.error ?? { message: String(e) } };
  }
}

let results;
if (plan.concurrent) {
  results = await Promise.all(plan.requests.map(run));
} else {
  results = [];
  for (const request of plan.requests) results.push(await run(request));
}
process.stdout.write(JSON.stringify(results) + '\n');
