// The npm openai SDK's background calls against the gateway (tests/clients/test_npm_background.py):
// responses.create({background: true}), polling responses.retrieve, responses.retrieve with
// {stream: true, starting_after}, responses.cancel. Prints one JSON line of what it saw.
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.GATEWAY_URL + "/v1", apiKey: process.env.GATEWAY_KEY, maxRetries: 0 });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

let res = await client.responses.create({ model: "m", input: "hi", background: true });
const created = res.status;
while (res.status === "queued" || res.status === "in_progress") {
  await sleep(100);
  res = await client.responses.retrieve(res.id);
}
const numbers = [];
const stream = await client.responses.retrieve(res.id, { stream: true, starting_after: 3 });
for await (const event of stream) numbers.push(event.sequence_number);
const other = await client.responses.create({ model: "m", input: "hi", background: true });
await sleep(700);
const cancelled = await client.responses.cancel(other.id);
console.log(JSON.stringify({ created, status: res.status, text: res.output_text, numbers, cancelled: cancelled.status }));
