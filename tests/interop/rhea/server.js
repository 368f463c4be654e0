'use strict';
// A request-response service written with rhea, for pairlink's client to call in the interop
// tests. It speaks the AMQP management convention as a rhea user writes it, with no pairlink
// code: the operation in application-properties "operation" (or the subject); an amqp-value
// body read as list = positional arguments, map = keywords, null = none, anything else = one
// argument; replies to the request's reply-to with correlation-id = its message-id and
// status-code / status-description in application-properties. Numbers are plain JS numbers,
// which rhea encodes as the smallest fitting AMQP type (uint for 3 or 200): a caller must read
// any AMQP integer.
//
// It offers no LINK_PAIR_V1_0: rhea 3.0.5 keeps a session's links by name only, so the two
// halves of a pair (one name, one session, as a pairing client opens them) would collide.
// Callers use the classic pattern: a receiver with a dynamic source for the replies.
//
// argv: --timeout-ms N. Prints {"port": N} once listening on 127.0.0.1 (a free port); when stdin
// ends, prints {rhea, requests, error} (every request it saw) and exits.

const { rhea, VERSION, finish, deadline, describe } = require('./common.js');

const OPERATIONS = {
    add: { params: ['a', 'b'], fn: (a, b) => a + b },
    echo: { params: ['x'], fn: (x) => x },
    greet: { params: ['name', 'greeting'], fn: (name, greeting) => `${greeting || 'hello'}, ${name}` },
    ping: { params: [], fn: () => 'pong' },
};

class Status extends Error {
    constructor(code, description) {
        super(description);
        this.code = code;
    }
}

function bodyKind(body) {
    if (body !== null && typeof body === 'object' && body.constructor && body.constructor.name === 'Section') {
        return { 0x75: 'data', 0x76: 'amqp-sequence' }[body.typecode];
    }
    return 'amqp-value';
}

function isMap(value) {
    return value !== null && typeof value === 'object' && !Array.isArray(value) && !Buffer.isBuffer(value);
}

function call(message) {
    const operation = (message.application_properties || {}).operation || message.subject;
    const op = OPERATIONS[operation];
    if (!op) throw new Status(404, `unknown operation: ${operation}`);
    if (bodyKind(message.body) !== 'amqp-value') throw new Status(400, 'only amqp-value bodies are read');
    const body = message.body;
    let args;
    if (body === null || body === undefined) args = [];
    else if (Array.isArray(body)) args = body;
    else if (isMap(body)) {
        const unknown = Object.keys(body).filter((k) => !op.params.includes(k));
        if (unknown.length) throw new Status(400, `unexpected keywords: ${unknown.join(', ')}`);
        args = op.params.map((p) => body[p]);
    } else args = [body];
    if (args.length > op.params.length) throw new Status(400, `${operation} takes ${op.params.length} arguments`);
    return op.fn(...args);
}

function main() {
    const args = process.argv.slice(2);
    const timeoutMs = Number(args[args.indexOf('--timeout-ms') + 1] || 30000);
    const report = { rhea: VERSION, requests: [], error: null };
    deadline(timeoutMs, report);

    const container = rhea.create_container({ id: 'rhea-server' });
    const replySenders = new Map(); // reply address -> sender
    let dynamicCount = 0;

    container.on('sender_open', (ctx) => {
        const source = ctx.sender.source || {};
        let address = source.address;
        if (source.dynamic) {
            dynamicCount += 1;
            address = `rhea-server/dyn/${dynamicCount}`;
        }
        ctx.sender.set_source({ address });
        ctx.sender.set_target({ address: (ctx.sender.target || {}).address });
        replySenders.set(address, ctx.sender);
    });
    container.on('receiver_open', (ctx) => {
        ctx.receiver.set_source({ address: (ctx.receiver.source || {}).address });
        ctx.receiver.set_target({ address: (ctx.receiver.target || {}).address });
    });
    container.on('sender_close', (ctx) => {
        for (const [address, sender] of replySenders) if (sender === ctx.sender) replySenders.delete(address);
    });
    container.on('message', (ctx) => {
        const request = ctx.message;
        report.requests.push(Object.assign(describe(request), { body_kind: bodyKind(request.body) }));
        const reply = { to: request.reply_to, correlation_id: request.message_id };
        try {
            reply.body = call(request);
            reply.application_properties = { 'status-code': 200, 'status-description': 'OK' };
        } catch (err) {
            if (!(err instanceof Status)) throw err;
            reply.application_properties = { 'status-code': err.code, 'status-description': err.message };
        }
        const sender = replySenders.get(request.reply_to);
        if (sender) sender.send(reply);
        else report.error = report.error || `no reply link for reply-to ${request.reply_to}`;
    });
    container.on('error', (err) => {
        report.error = report.error || `rhea error: ${err && err.message}`;
    });

    const server = container.listen({ host: '127.0.0.1', port: 0 });
    server.on('listening', () => process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n'));
    server.on('error', (err) => {
        report.error = `listen failed: ${err.message}`;
        finish(report, 1);
    });
    process.stdin.resume();
    process.stdin.on('end', () => finish(report, report.error ? 1 : 0));
}

main();
