'use strict';
// A rhea client calling a request-response service, written for pairlink's interop tests.
//
// stdin: a job {port, sasl: "none"|"anonymous"|"plain", username?, password?, container_id?,
//   pattern: "paired"|"dynamic", address, link_name? (paired), timeout_ms,
//   requests: [{message_id, subject?, application_properties?, body?, reply_to?}]}.
// stdout: one line {rhea, pattern, offered_capabilities, reply_address, outcomes, replies,
//   error}; exit code 0 once every request has its reply and its outcome, else 1.
//
// "paired" opens a link pair by hand (LINK_PAIR_V1_0: a sender and a receiver of one name, each
// with properties {paired: true}, our own address mirrored) and asks for replies with
// reply-to "$me". "dynamic" is rhea's classic request-response client: a receiver with a
// dynamic source, a sender to the service, reply-to the address the service gave.
//
// Requests go out as fast as credit allows (pipelined), never waiting for a reply.

const { rhea, VERSION, readJob, finish, deadline, describe, connectOptions, symbols, OUTCOMES } = require('./common.js');

async function main() {
    const job = await readJob();
    const requests = job.requests;
    const result = {
        rhea: VERSION,
        pattern: job.pattern,
        offered_capabilities: null,
        reply_address: null,
        outcomes: requests.map(() => null),
        replies: [],
        error: null,
    };
    deadline(job.timeout_ms, result);
    const fail = (error) => {
        result.error = result.error || error;
        finish(result, 1);
    };

    const container = rhea.create_container({ id: job.container_id || 'rhea-client' });
    const conn = container.connect(connectOptions(job));
    conn.on('connection_open', (ctx) => {
        result.offered_capabilities = symbols(ctx.connection.remote.open.offered_capabilities);
    });
    conn.on('connection_error', (ctx) => fail(`connection error: ${JSON.stringify(ctx.connection.error)}`));
    conn.on('connection_close', () => fail('the peer closed the connection'));
    conn.on('disconnected', (ctx) => fail(`disconnected: ${ctx.error ? ctx.error.message : 'no error given'}`));
    conn.on('sender_error', (ctx) => fail(`request link detached: ${JSON.stringify(ctx.sender.error)}`));
    conn.on('receiver_error', (ctx) => fail(`reply link detached: ${JSON.stringify(ctx.receiver.error)}`));
    container.on('error', (err) => fail(`rhea error: ${err && err.message}`));

    const index = new Map(); // delivery -> request index
    let next = 0;
    let sender = null;
    let replyTo = '$me';
    let opened = 0; // attaches the service answered

    const done = () => {
        if (result.replies.length === requests.length && result.outcomes.every((o) => o !== null)) {
            conn.close();
            finish(result, 0);
        }
    };
    const sendSome = () => {
        // rhea 3.0.5 defects, worked around: it may write a transfer before a pending attach,
        // and it splits a message into frames at send() time by the peer's max-frame-size even
        // when the peer's open has not arrived yet (a 1 MiB body then goes as one oversized
        // frame). So the first request waits until the service has answered both attaches
        // (its open came before them) instead of being pipelined with them (LP-10).
        if (opened < 2) return;
        while (next < requests.length && sender.sendable()) {
            const request = Object.assign({ reply_to: replyTo }, requests[next]);
            index.set(sender.send(request), next);
            next += 1;
        }
    };
    const outcome = (name) => (ctx) => {
        result.outcomes[index.get(ctx.delivery)] = name;
        done();
    };
    for (const name of OUTCOMES) conn.on(name, outcome(name));
    conn.on('settled', (ctx) => {
        const i = index.get(ctx.delivery);
        if (i !== undefined && result.outcomes[i] === null) outcome('settled')(ctx);
    });
    conn.on('message', (ctx) => {
        result.replies.push(describe(ctx.message));
        done();
    });
    conn.on('sendable', sendSome);
    const attached = () => {
        opened += 1;
        sendSome();
    };

    if (job.pattern === 'paired') {
        const name = job.link_name;
        const paired = { paired: true };
        // rhea 3.0.5 defect, worked around: a session keeps its links in a map by name, so the
        // second half of a pair (same name) would replace the first. Each half gets a session.
        const requestSession = conn.create_session();
        const replySession = conn.create_session();
        requestSession.begin();
        replySession.begin();
        replySession.attach_receiver({
            name,
            source: { address: job.address },
            target: { address: name },
            properties: paired,
        });
        sender = requestSession.attach_sender({
            name,
            source: { address: name },
            target: { address: job.address },
            properties: paired,
        });
        conn.on('receiver_open', attached);
        conn.on('sender_open', attached);
    } else if (job.pattern === 'dynamic') {
        conn.open_receiver({ source: { dynamic: true } });
        conn.on('receiver_open', (ctx) => {
            replyTo = ctx.receiver.source.address;
            result.reply_address = replyTo;
            attached();
            sender = conn.open_sender(job.address);
        });
        conn.on('sender_open', attached);
    } else {
        fail(`unknown pattern ${job.pattern}`);
    }
}

main().catch((err) => finish({ rhea: VERSION, error: `client failed: ${err && err.stack}` }, 1));
