// Tool calling and reasoning through the official `openai` npm client, against a running Troupe
// server on a model of one family (tests/e2e/agents_e2e_test.cpp). ajv judges every call's
// arguments against its function's JSON schema.
//
//   node agents_client.mjs @plan.json
//
// plan: {base_url, model, api_key?, seeds: n, reasoning: "none" | "think" | "harmony"}
// Prints {checks: [{name, ok, detail}], samples: {...}}: a check is ok when every request of it
// behaved; detail says what did not.
import { readFileSync } from 'node:fs';
import OpenAI from 'openai';
import Ajv from 'ajv';

const argument = process.argv[2];
const plan = JSON.parse(argument.startsWith('@') ? readFileSync(argument.slice(1), 'utf8') : argument);
const client = new OpenAI({ baseURL: plan.base_url, apiKey: plan.api_key ?? 'none', maxRetries: 0, timeout: 600_000 });  // a bearer token
const ajv = new Ajv({ strict: false });

const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'The current weather in a city',
      parameters: {
        type: 'object',
        properties: {
          location: { type: 'string', description: 'City name', maxLength: 24 },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        },
        required: ['location'],
        additionalProperties: false,
      },
    },
  },
  {
    type: 'function',
    function: {
      name: 'search',
      description: 'Search the web',
      parameters: {
        type: 'object',
        properties: { query: { type: 'string', maxLength: 30 }, limit: { type: 'integer', minimum: 1, maximum: 5 } },
        required: ['query', 'limit'],
      },
    },
  },
];
const validators = Object.fromEntries(tools.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
const user = { role: 'user', content: 'What is the weather in Paris? Use the tools.' };
const base = { model: plan.model, max_tokens: 160 };
const checks = [];
const samples = {};

function check(name, problems, detail = undefined) {
  checks.push({ name, ok: problems.length === 0, detail: problems.length ? problems.slice(0, 5) : detail });
}

// Problems with one message's tool calls (none when they are all valid calls of offered tools).
function callProblems(calls, only = undefined) {
  const problems = [];
  if (!Array.isArray(calls) || calls.length === 0) return ['no tool_calls'];
  for (const call of calls) {
    if (call.type !== 'function' || typeof call.id !== 'string' || call.id.length === 0) problems.push(`bad call ${JSON.stringify(call)}`);
    const validate = validators[call.function?.name];
    if (!validate) {
      problems.push(`call of an unknown tool ${call.function?.name}`);
      continue;
    }
    if (only && call.function.name !== only) problems.push(`called ${call.function.name}, not ${only}`);
    let args;
    try {
      args = JSON.parse(call.function.arguments);
    } catch (e) {
      problems.push(`arguments are not JSON: ${call.function.arguments}`);
      continue;
    }
    if (!validate(args)) problems.push(`${call.function.name}(${call.function.arguments}): ${ajv.errorsText(validate.errors)}`);
  }
  return problems;
}

// A streamed chat reassembled as the SDK's users do: content and reasoning concatenated, tool
// calls gathered by index. Also notes chunks that mix reasoning with content.
async function streamed(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const out = { content: '', reasoning: '', calls: [], finish_reason: null, mixed: 0, chunks: 0 };
  for await (const chunk of stream) {
    out.chunks += 1;
    for (const c of chunk.choices) {
      const d = c.delta ?? {};
      if (d.content) out.content += d.content;
      if (d.reasoning_content) out.reasoning += d.reasoning_content;
      if (d.content && d.reasoning_content) out.mixed += 1;
      for (const t of d.tool_calls ?? []) {
        const call = (out.calls[t.index] ??= { id: '', type: 'function', function: { name: '', arguments: '' } });
        if (t.id) call.id = t.id;
        if (t.function?.name) call.function.name += t.function.name;
        if (t.function?.arguments) call.function.arguments += t.function.arguments;
      }
      if (c.finish_reason) out.finish_reason = c.finish_reason;
    }
  }
  return out;
}

async function attempt(name, body) {
  try {
    await body();
  } catch (e) {
    check(name, [`threw: ${e.status ?? ''} ${JSON.stringify(e.error ?? String(e))}`]);
  }
}

// 1. tool_choice "required" on random weights, sampled: every output is valid calls.
let firstCalls = null;
await attempt('required_calls_validate', async () => {
  const problems = [];
  for (let seed = 0; seed < plan.seeds; seed += 1) {
    const r = await client.chat.completions.create({ ...base, messages: [user], tools, tool_choice: 'required', temperature: 1, seed });
    const m = r.choices[0].message;
    problems.push(...callProblems(m.tool_calls).map((p) => `seed ${seed}: ${p}`));
    if (r.choices[0].finish_reason !== 'tool_calls') problems.push(`seed ${seed}: finish_reason ${r.choices[0].finish_reason}`);
    firstCalls ??= m.tool_calls;
    samples.required ??= m;
  }
  check('required_calls_validate', problems);
});

// 2. A named function: only it is called.
await attempt('named_call_validates', async () => {
  const problems = [];
  for (let seed = 0; seed < plan.seeds; seed += 1) {
    const r = await client.chat.completions.create({
      ...base, messages: [user], tools, tool_choice: { type: 'function', function: { name: 'search' } }, temperature: 1, seed,
    });
    problems.push(...callProblems(r.choices[0].message.tool_calls, 'search').map((p) => `seed ${seed}: ${p}`));
    samples.named ??= r.choices[0].message;
  }
  check('named_call_validates', problems);
});

// 3. Streamed tool-call deltas reassemble to the call made without streaming.
await attempt('streamed_calls_reassemble', async () => {
  const params = { ...base, messages: [user], tools, tool_choice: 'required', temperature: 0, seed: 3 };
  const whole = (await client.chat.completions.create(params)).choices[0];
  const parts = await streamed(params);
  const problems = callProblems(parts.calls);
  const names = (calls) => JSON.stringify(calls.map((c) => [c.function.name, c.function.arguments]));
  if (names(parts.calls) !== names(whole.message.tool_calls ?? [])) {
    problems.push(`streamed ${names(parts.calls)} != whole ${names(whole.message.tool_calls ?? [])}`);
  }
  if (parts.finish_reason !== whole.finish_reason) problems.push(`finish ${parts.finish_reason} != ${whole.finish_reason}`);
  if (parts.content !== (whole.message.content ?? '')) problems.push(`content ${JSON.stringify(parts.content)} != ${JSON.stringify(whole.message.content)}`);
  samples.streamed = parts;
  check('streamed_calls_reassemble', problems);
});

// 4. A conversation of several turns: the call, its result, the answer (auto), then a plain
//    turn (tool_choice none): the template renders assistant tool_calls and tool messages.
await attempt('multi_turn_conversation', async () => {
  const problems = [];
  const calls = firstCalls ?? [];
  if (calls.length === 0) problems.push('no call from the first turn');
  const messages = [user, { role: 'assistant', content: null, tool_calls: calls }];
  for (const call of calls) messages.push({ role: 'tool', tool_call_id: call.id, content: '{"temperature": 21, "sky": "clear"}' });
  for (const [seed, choice] of [[1, 'auto'], [2, 'auto']]) {
    const r = await client.chat.completions.create({ ...base, messages, tools, tool_choice: choice, temperature: 1, seed });
    const m = r.choices[0].message;
    if (m.tool_calls?.length) problems.push(...callProblems(m.tool_calls));
    else if (typeof m.content !== 'string') problems.push(`turn 2: no content and no calls: ${JSON.stringify(m)}`);
    samples.answer ??= m;
  }
  messages.push({ role: 'assistant', content: 'It is 21 degrees and clear.' }, { role: 'user', content: 'Thanks! And tomorrow?' });
  const r = await client.chat.completions.create({ ...base, max_tokens: 24, messages, tools, tool_choice: 'none', temperature: 1, seed: 4 });
  const m = r.choices[0].message;
  if (m.tool_calls?.length) problems.push(`tool_choice none made calls: ${JSON.stringify(m.tool_calls)}`);
  if (typeof m.content !== 'string') problems.push(`turn 3: content ${JSON.stringify(m.content)}`);
  check('multi_turn_conversation', problems);
});

// 5. "auto": text, or calls that validate; never a broken call.
await attempt('auto_text_or_valid_calls', async () => {
  const problems = [];
  let numCalls = 0;
  for (let seed = 0; seed < plan.seeds; seed += 1) {
    const r = await client.chat.completions.create({ ...base, max_tokens: 80, messages: [user], tools, temperature: 1, seed });
    const m = r.choices[0].message;
    if (m.tool_calls?.length) {
      numCalls += 1;
      problems.push(...callProblems(m.tool_calls).map((p) => `seed ${seed}: ${p}`));
    } else if (typeof m.content !== 'string') {
      problems.push(`seed ${seed}: no content: ${JSON.stringify(m)}`);
    }
  }
  check('auto_text_or_valid_calls', problems, { num_calls: numCalls });
});

// 6. Fields the server does not know are ignored, and named in a header.
await attempt('unknown_fields_ignored', async () => {
  const { data, response } = await client.chat.completions
    .create({ ...base, max_tokens: 4, messages: [user], reasoning_effort: 'low', some_future_field: { x: 1 }, temperature: 0 })
    .withResponse();
  const header = response.headers.get('x-troupe-ignored-fields') ?? '';
  const problems = [];
  if (!header.includes('some_future_field')) problems.push(`header: ${JSON.stringify(header)}`);
  if (!data.choices?.length) problems.push('no choices');
  check('unknown_fields_ignored', problems);
});

// 7. Reasoning: split into reasoning_content, streamed in chunks of its own, and structured
//    output applying to the answer after it.
if (plan.reasoning !== 'none') {
  await attempt('reasoning_then_structured_answer', async () => {
    const schema = {
      type: 'object',
      properties: { answer: { type: 'string', maxLength: 12 }, n: { type: 'integer', minimum: 0, maximum: 9 } },
      required: ['answer', 'n'],
    };
    const validate = ajv.compile(schema);
    const problems = [];
    const response_format = { type: 'json_schema', json_schema: { name: 'a', schema, strict: true } };
    for (let seed = 0; seed < plan.seeds; seed += 1) {
      const params = { ...base, max_tokens: 200, messages: [{ role: 'user', content: 'Think, then answer.' }], response_format, temperature: 1, seed };
      const whole = (await client.chat.completions.create(params)).choices[0].message;
      let value;
      try {
        value = JSON.parse(whole.content);
      } catch (e) {
        problems.push(`seed ${seed}: content is not JSON: ${JSON.stringify(whole.content)}`);
        continue;
      }
      if (!validate(value)) problems.push(`seed ${seed}: ${ajv.errorsText(validate.errors)}`);
      if (!('reasoning_content' in whole)) problems.push(`seed ${seed}: no reasoning_content field`);
      const parts = await streamed(params);
      if (parts.mixed) problems.push(`seed ${seed}: ${parts.mixed} chunks mix reasoning and content`);
      if (parts.content !== whole.content) problems.push(`seed ${seed}: streamed content ${JSON.stringify(parts.content)} != ${JSON.stringify(whole.content)}`);
      if (parts.reasoning !== (whole.reasoning_content ?? '')) problems.push(`seed ${seed}: streamed reasoning differs`);
      samples.reasoning ??= whole;
    }
    if (plan.reasoning === 'think') {
      // Thinking switched off through the template: no reasoning at all.
      const r = await client.chat.completions.create({
        ...base, max_tokens: 60, messages: [{ role: 'user', content: 'Answer.' }], response_format, temperature: 1, seed: 9,
        chat_template_kwargs: { enable_thinking: false },
      });
      const m = r.choices[0].message;
      if (m.reasoning_content) problems.push(`enable_thinking false still reasoned: ${JSON.stringify(m.reasoning_content)}`);
      try {
        if (!validate(JSON.parse(m.content))) problems.push(`enable_thinking false: ${ajv.errorsText(validate.errors)}`);
      } catch (e) {
        problems.push(`enable_thinking false: content is not JSON: ${JSON.stringify(m.content)}`);
      }
    }
    check('reasoning_then_structured_answer', problems);
  });
}

process.stdout.write(JSON.stringify({ checks, samples }) + '\n');
