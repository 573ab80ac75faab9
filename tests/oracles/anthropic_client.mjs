// Anthropic's Messages API through the official `@anthropic-ai/sdk` npm client, against a running
// Troupe server (tests/e2e/agents_e2e_test.cpp): tools and tool_choice, tool_use / tool_result
// turns, system prompts, streaming events reassembled by the SDK's MessageStream, thinking blocks,
// errors in Anthropic's shape, the key sent as x-api-key. ajv judges every tool input.
//
//   node anthropic_client.mjs @plan.json
//
// plan: {base_url, model, api_key, seeds: n, reasoning: "none" | "think" | "harmony"}
// Prints {checks: [{name, ok, detail}], samples: {...}}.
import { readFileSync } from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import Ajv from 'ajv';

const argument = process.argv[2];
const plan = JSON.parse(argument.startsWith('@') ? readFileSync(argument.slice(1), 'utf8') : argument);
// The SDK sends the key as x-api-key (and never as a bearer token).
const client = new Anthropic({ baseURL: plan.base_url, apiKey: plan.api_key, maxRetries: 0, timeout: 600_000 });
const ajv = new Ajv({ strict: false });

const tools = [
  {
    name: 'get_weather',
    description: 'The current weather in a city',
    input_schema: {
      type: 'object',
      properties: { location: { type: 'string', maxLength: 24 }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['location'],
    },
  },
  {
    name: 'search',
    description: 'Search the web',
    input_schema: {
      type: 'object',
      properties: { query: { type: 'string', maxLength: 30 }, limit: { type: 'integer', minimum: 1, maximum: 5 } },
      required: ['query', 'limit'],
    },
  },
];
const validators = Object.fromEntries(tools.map((t) => [t.name, ajv.compile(t.input_schema)]));
const user = { role: 'user', content: 'What is the weather in Paris? Use the tools.' };
const base = { model: plan.model, max_tokens: 160 };
const checks = [];
const samples = {};

function check(name, problems, detail = undefined) {
  checks.push({ name, ok: problems.length === 0, detail: problems.length ? problems.slice(0, 5) : detail });
}

function toolUseProblems(content, only = undefined) {
  const uses = content.filter((b) => b.type === 'tool_use');
  if (uses.length === 0) return [`no tool_use block in ${JSON.stringify(content)}`];
  const problems = [];
  for (const b of uses) {
    if (typeof b.id !== 'string' || !b.id) problems.push(`tool_use without an id: ${JSON.stringify(b)}`);
    const validate = validators[b.name];
    if (!validate) {
      problems.push(`tool_use of an unknown tool ${b.name}`);
      continue;
    }
    if (only && b.name !== only) problems.push(`used ${b.name}, not ${only}`);
    if (!validate(b.input)) problems.push(`${b.name}(${JSON.stringify(b.input)}): ${ajv.errorsText(validate.errors)}`);
  }
  return problems;
}

async function attempt(name, body) {
  try {
    await body();
  } catch (e) {
    check(name, [`threw: ${e.status ?? ''} ${JSON.stringify(e.error ?? String(e))}`]);
  }
}

// 1. tool_choice any: every answer is valid tool_use blocks, stop_reason tool_use.
let firstContent = null;
await attempt('any_tool_use_validates', async () => {
  const problems = [];
  for (let seed = 0; seed < plan.seeds; seed += 1) {
    const m = await client.messages.create({ ...base, messages: [user], tools, tool_choice: { type: 'any' }, temperature: 1, top_k: 50 + seed });
    problems.push(...toolUseProblems(m.content).map((p) => `seed ${seed}: ${p}`));
    if (m.stop_reason !== 'tool_use') problems.push(`seed ${seed}: stop_reason ${m.stop_reason}`);
    if (m.type !== 'message' || m.role !== 'assistant' || !m.id) problems.push(`envelope ${JSON.stringify({ ...m, content: undefined })}`);
    if (!(m.usage?.input_tokens > 0 && m.usage?.output_tokens > 0)) problems.push(`usage ${JSON.stringify(m.usage)}`);
    firstContent ??= m.content;
    samples.any ??= m;
  }
  check('any_tool_use_validates', problems);
});

// 2. A named tool: only it is used.
await attempt('named_tool_validates', async () => {
  const m = await client.messages.create({ ...base, messages: [user], tools, tool_choice: { type: 'tool', name: 'search' }, temperature: 1 });
  check('named_tool_validates', toolUseProblems(m.content, 'search'));
});

// 3. The stream's events, reassembled by the SDK, give the message a request without streaming gets.
await attempt('stream_reassembles', async () => {
  const params = { ...base, messages: [user], tools, tool_choice: { type: 'any' }, temperature: 0 };
  const whole = await client.messages.create(params);
  const stream = client.messages.stream(params);
  const kinds = [];
  stream.on('streamEvent', (event) => kinds.push(event.type));
  const streamed = await stream.finalMessage();
  const problems = toolUseProblems(streamed.content);
  const shape = (m) => JSON.stringify(m.content.map((b) => (b.type === 'tool_use' ? [b.type, b.name, b.input] : [b.type, b.text ?? b.thinking])));
  if (shape(streamed) !== shape(whole)) problems.push(`streamed ${shape(streamed)} != whole ${shape(whole)}`);
  if (streamed.stop_reason !== whole.stop_reason) problems.push(`stop ${streamed.stop_reason} != ${whole.stop_reason}`);
  if (kinds[0] !== 'message_start' || kinds.at(-1) !== 'message_stop' || !kinds.includes('message_delta')) {
    problems.push(`events ${kinds.join(',')}`);
  }
  samples.events = kinds;
  check('stream_reassembles', problems);
});

// 4. tool_use, tool_result, answer; then a text turn with a system prompt and no tools allowed.
await attempt('multi_turn_with_tool_results', async () => {
  const problems = [];
  const content = firstContent ?? [];
  const uses = content.filter((b) => b.type === 'tool_use');
  if (uses.length === 0) problems.push('no tool_use from the first turn');
  const messages = [
    user,
    { role: 'assistant', content },
    { role: 'user', content: uses.map((u) => ({ type: 'tool_result', tool_use_id: u.id, content: '21 degrees, clear' })) },
  ];
  const answer = await client.messages.create({ ...base, messages, tools, temperature: 1 });
  if (answer.content.some((b) => b.type === 'tool_use')) problems.push(...toolUseProblems(answer.content));
  else if (!answer.content.some((b) => b.type === 'text')) problems.push(`no text: ${JSON.stringify(answer.content)}`);
  messages.push({ role: 'assistant', content: [{ type: 'text', text: 'It is 21 degrees.' }] }, { role: 'user', content: 'Thanks!' });
  const last = await client.messages.create({
    ...base, max_tokens: 20, system: [{ type: 'text', text: 'You are terse.' }], messages, tools, tool_choice: { type: 'none' }, temperature: 1,
  });
  if (last.content.some((b) => b.type === 'tool_use')) problems.push(`tool_choice none used a tool: ${JSON.stringify(last.content)}`);
  if (!last.content.some((b) => b.type === 'text')) problems.push(`last turn has no text: ${JSON.stringify(last.content)}`);
  samples.answer = answer;
  check('multi_turn_with_tool_results', problems);
});

// 5. A plain message with a system string, streamed as text deltas.
await attempt('system_prompt_and_text_stream', async () => {
  const params = { ...base, max_tokens: 12, system: 'You are a poet.', messages: [{ role: 'user', content: 'Hi' }], temperature: 0 };
  const whole = await client.messages.create(params);
  const streamed = await client.messages.stream(params).finalMessage();
  const text = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  const problems = [];
  if (text(streamed) !== text(whole)) problems.push(`streamed ${JSON.stringify(text(streamed))} != ${JSON.stringify(text(whole))}`);
  if (!['end_turn', 'max_tokens'].includes(whole.stop_reason)) problems.push(`stop_reason ${whole.stop_reason}`);
  check('system_prompt_and_text_stream', problems);
});

// 6. Errors in Anthropic's shape.
await attempt('errors_in_anthropic_shape', async () => {
  const problems = [];
  try {
    await client.messages.create({ model: plan.model, messages: [user] });  // no max_tokens
    problems.push('a request without max_tokens was accepted');
  } catch (e) {
    if (e.status !== 400 || e.error?.type !== 'error' || e.error?.error?.type !== 'invalid_request_error') {
      problems.push(`missing max_tokens: ${e.status} ${JSON.stringify(e.error)}`);
    }
  }
  try {
    await new Anthropic({ baseURL: plan.base_url, apiKey: 'wrong', maxRetries: 0 }).messages.create({ ...base, messages: [user] });
    problems.push('a wrong key was accepted');
  } catch (e) {
    if (e.status !== 401 || e.error?.error?.type !== 'authentication_error') problems.push(`wrong key: ${e.status} ${JSON.stringify(e.error)}`);
  }
  check('errors_in_anthropic_shape', problems);
});

// 7. Thinking: the reasoning comes back as a thinking block, streamed as thinking deltas.
if (plan.reasoning !== 'none') {
  await attempt('thinking_blocks', async () => {
    const problems = [];
    const params = { ...base, max_tokens: 60, messages: [{ role: 'user', content: 'Think first.' }], thinking: { type: 'enabled', budget_tokens: 1024 }, temperature: 1 };
    let thought = 0;
    for (let seed = 0; seed < plan.seeds; seed += 1) {
      const whole = await client.messages.create({ ...params, top_k: 40 + seed });
      const streamed = await client.messages.stream({ ...params, top_k: 40 + seed }).finalMessage();
      if (whole.content.some((b) => b.type === 'thinking')) thought += 1;
      for (const m of [whole, streamed]) {
        const order = m.content.map((b) => b.type);
        if (order.indexOf('thinking') > 0) problems.push(`thinking is not the first block: ${order}`);
      }
      samples.thinking ??= whole;
    }
    if (plan.reasoning === 'think') {
      const off = await client.messages.create({ ...params, thinking: { type: 'disabled' } });
      if (off.content.some((b) => b.type === 'thinking')) problems.push(`thinking disabled still thought: ${JSON.stringify(off.content)}`);
    }
    check('thinking_blocks', problems, { thought });
  });
}

process.stdout.write(JSON.stringify({ checks, samples }) + '\n');
