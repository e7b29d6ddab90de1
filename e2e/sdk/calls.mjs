// The official SDKs calling a kvroute mesh with no change but the base
// URL: the Anthropic SDK's messages.create (plain and streamed) and the
// OpenAI SDK's responses.create (plain, streamed, stored and continued,
// and read back through another sidecar). e2e/sdk_test.go runs it against
// a local mesh and checks each line it prints: one JSON object per call,
// with the pod that served it (X-Kvroute-Served-By) and the cached tokens
// the engine reported.
//
//   KVROUTE_URLS=http://a:8000,... KVROUTE_ADMIN_URLS=http://a:9090,... MODEL=sim-model node calls.mjs
//
// Between placing a prompt and following it up through the other
// sidecars it waits, on a deadline, until each says (/debug/route) that it
// would send the follow-up to the holder: the mesh needs a few
// milliseconds to hear of a new prefix, and the SDK calls come faster.
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

const urls = process.env.KVROUTE_URLS.split(',');
const admins = process.env.KVROUTE_ADMIN_URLS.split(',');

async function waitRouted(api, body, holder) {
  const deadline = Date.now() + 15000;
  for (const admin of admins) {
    for (;;) {
      const r = await fetch(`${admin}/debug/route?api=${api}`, { method: 'POST', body: JSON.stringify(body) });
      const d = (await r.json()).decision || {};
      if (d.target === holder && d.reason === 'affinity') break;
      if (Date.now() > deadline) throw new Error(`${admin} routes ${api} to ${d.target} (${d.reason}), not ${holder}`);
      await new Promise((res) => setTimeout(res, 20));
    }
  }
}
const model = process.env.MODEL || 'sim-model';
const system = Array.from({ length: 160 }, (_, i) => `Rule ${i}: answer politely and cite the policy section.`).join(' ');
const out = (o) => console.log(JSON.stringify(o));
const servedBy = (h) => h.get('x-kvroute-served-by');

let holder = '';
for (const [i, base] of urls.entries()) {
  const anthropic = new Anthropic({ baseURL: base, apiKey: 'none', maxRetries: 0 });
  const { data, response } = await anthropic.messages
    .create({ model, max_tokens: 8, system, messages: [{ role: 'user', content: 'Where is my order?' }] })
    .withResponse();
  out({ api: 'messages', via: i, served_by: servedBy(response.headers), type: data.type,
        text: data.content[0].text, input: data.usage.input_tokens, cached: data.usage.cache_read_input_tokens ?? 0 });
  if (i === 0) {
    holder = servedBy(response.headers);
    await waitRouted('messages', { model, max_tokens: 8, system, messages: [{ role: 'user', content: 'Where?' }] }, holder);
  }
}
{
  const anthropic = new Anthropic({ baseURL: urls[1], apiKey: 'none', maxRetries: 0 });
  const stream = anthropic.messages.stream({ model, max_tokens: 8, system,
    messages: [{ role: 'user', content: 'Where is my order?' }] });
  let text = '';
  stream.on('text', (t) => { text += t; });
  const msg = await stream.finalMessage();
  out({ api: 'messages-stream', via: 1, type: msg.type, text, stop: msg.stop_reason,
        cached: msg.usage.cache_read_input_tokens ?? 0 });
}

const instructions = system;
for (const [i, base] of urls.entries()) {
  const openai = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0 });
  const { data, response } = await openai.responses
    .create({ model, instructions, input: 'Where is my order?', max_output_tokens: 8 })
    .withResponse();
  out({ api: 'responses', via: i, served_by: servedBy(response.headers), object: data.object,
        text: data.output_text, cached: data.usage.input_tokens_details.cached_tokens });
  if (i === 0) {
    await waitRouted('responses', { model, instructions, input: 'Where?', max_output_tokens: 8 }, servedBy(response.headers));
  }
}
{
  const openai = new OpenAI({ baseURL: urls[2] + '/v1', apiKey: 'none', maxRetries: 0 });
  const stream = await openai.responses.create({ model, instructions, input: 'Where is my order?',
    max_output_tokens: 8, stream: true });
  let text = '', done = null;
  for await (const ev of stream) {
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed') done = ev.response;
  }
  out({ api: 'responses-stream', via: 2, text, status: done && done.status,
        cached: done ? done.usage.input_tokens_details.cached_tokens : -1 });
}
{
  // Stored on whichever pod serves it, continued and read through the others.
  const first = new OpenAI({ baseURL: urls[0] + '/v1', apiKey: 'none', maxRetries: 0 });
  const { data: r1, response: h1 } = await first.responses
    .create({ model, instructions, input: 'Remember the number 42.', max_output_tokens: 8, store: true })
    .withResponse();
  out({ api: 'responses-store', via: 0, id: r1.id, served_by: servedBy(h1.headers) });
  for (const [i, base] of urls.entries()) {
    const c = new OpenAI({ baseURL: base + '/v1', apiKey: 'none', maxRetries: 0 });
    const { data: got, response: hg } = await c.responses.retrieve(r1.id).withResponse();
    out({ api: 'responses-retrieve', via: i, id: got.id, served_by: servedBy(hg.headers) });
    const { data: next, response: hn } = await c.responses
      .create({ model, instructions, previous_response_id: r1.id, input: 'Which number?', max_output_tokens: 8 })
      .withResponse();
    out({ api: 'responses-continue', via: i, id: next.id, served_by: servedBy(hn.headers),
          cached: next.usage.input_tokens_details.cached_tokens });
  }
}
