#!/usr/bin/env node
// The load benchmark's client floor: a server that answers the calls one bench-load.mjs iteration
// makes (create, commands, kill, list) at once, with the smallest valid E2B responses, and does no
// sandbox work at all. Run against it, the same shapes measure what the official JS SDK and the
// Node.js event loop alone cost on this machine, so the real server's figures can be read as
// "floor + server". It is a measuring stick for bench/bench-load.mjs (--floor), never a product
// path: every command "prints" `v0 Linux`, which satisfies the bench's output checks.
//
//   node bench/bench-sdk-floor.mjs PORT      (listens on 127.0.0.1:PORT, prints "ready")

import http from 'node:http'
import { randomBytes } from 'node:crypto'

const port = Number(process.argv[2])
if (!Number.isInteger(port) || port <= 0) {
  console.error('usage: bench-sdk-floor.mjs PORT')
  process.exit(2)
}

// Connect's streaming envelope: flags byte, big-endian length, JSON message.
function envelope(flags, message) {
  const body = Buffer.from(JSON.stringify(message))
  const head = Buffer.alloc(5)
  head.writeUInt8(flags, 0)
  head.writeUInt32BE(body.length, 1)
  return Buffer.concat([head, body])
}
const OUTPUT = Buffer.from('v0 Linux\n').toString('base64')
const PROCESS_STREAM = Buffer.concat([
  envelope(0, { event: { start: { pid: 1 } } }),
  envelope(0, { event: { data: { stdout: OUTPUT } } }),
  envelope(0, { event: { end: { exitCode: 0, exited: true, status: 'exit status 0' } } }),
  envelope(2, {}),
])

let pid = 1
const server = http.createServer((req, res) => {
  // Drain the body first: the SDK waits for the request to be consumed on some paths.
  req.resume()
  req.on('end', () => {
    const url = req.url.split('?')[0]
    if (req.method === 'POST' && url === '/v2/sandboxes') {
      const id = 'i' + randomBytes(10).toString('hex')
      res.writeHead(201, { 'content-type': 'application/json' })
      res.end(
        JSON.stringify({
          sandboxID: id,
          templateID: 'base',
          clientID: 'floor',
          envdVersion: '0.2.0',
          envdAccessToken: randomBytes(16).toString('hex'),
        }),
      )
    } else if (req.method === 'POST' && url === '/process.Process/Start') {
      pid += 1
      res.writeHead(200, { 'content-type': 'application/connect+json' })
      res.end(PROCESS_STREAM)
    } else if (req.method === 'DELETE' && url.startsWith('/sandboxes/')) {
      res.writeHead(204)
      res.end()
    } else if (req.method === 'GET' && (url === '/v2/sandboxes' || url === '/sandboxes')) {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end('[]')
    } else if (req.method === 'GET' && url === '/health') {
      res.writeHead(204)
      res.end()
    } else {
      res.writeHead(404, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ code: 404, message: `the SDK floor server does not answer ${req.method} ${url}` }))
    }
  })
})
server.keepAliveTimeout = 60_000
server.listen(port, '127.0.0.1', () => console.log('ready'))
