'use strict';
// What the rhea peers of the interop tests share (tests/interop/rhea_peers.py drives them):
// a job read as JSON from stdin, one JSON result on stdout, a deadline that fails the process
// instead of letting it hang, and AMQP values made JSON-safe.

const rhea = require('rhea');
const VERSION = require('rhea/package.json').version;

/** The whole of stdin, parsed as JSON (a job can hold a 1 MiB body: too big for argv). */
function readJob() {
    return new Promise((resolve, reject) => {
        const chunks = [];
        process.stdin.on('data', (chunk) => chunks.push(chunk));
        process.stdin.on('end', () => {
            try {
                resolve(JSON.parse(Buffer.concat(chunks).toString('utf8')));
            } catch (err) {
                reject(err);
            }
        });
        process.stdin.on('error', reject);
    });
}

let finished = false;

/** Write ``result`` as one line of JSON, then exit with ``code`` once stdout has it all; only
 * the first call counts (events of a closing connection may follow the result). */
function finish(result, code) {
    if (finished) return;
    finished = true;
    process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(code));
}

/** Fail with ``result.error`` set unless the process ends within ``ms``: a peer never hangs. */
function deadline(ms, result) {
    const timer = setTimeout(() => {
        result.error = result.error || `timed out after ${ms} ms`;
        finish(result, 1);
    }, ms);
    timer.unref();
}

/** A value rhea decoded, as JSON: binary becomes {"binary": base64}, a timestamp {"timestamp": ms}. */
function plain(value) {
    if (value === undefined || value === null) return null;
    if (Buffer.isBuffer(value)) return { binary: value.toString('base64') };
    if (value instanceof Date) return { timestamp: value.getTime() };
    if (Array.isArray(value)) return value.map(plain);
    if (typeof value === 'object') {
        const out = {};
        for (const key of Object.keys(value)) out[key] = plain(value[key]);
        return out;
    }
    return value;
}

/** The fields of a message the tests look at. */
function describe(message) {
    return {
        message_id: plain(message.message_id),
        correlation_id: plain(message.correlation_id),
        to: plain(message.to),
        reply_to: plain(message.reply_to),
        subject: plain(message.subject),
        content_type: plain(message.content_type),
        application_properties: plain(message.application_properties),
        body: plain(message.body),
    };
}

/** rhea's connect options for a job: 127.0.0.1, no reconnect (a failure is final), and the
 * job's SASL choice. rhea opens with the plain AMQP header unless given a username. */
function connectOptions(job) {
    const options = {
        host: '127.0.0.1',
        port: job.port,
        reconnect: false,
        idle_time_out: 0,
    };
    if (job.sasl === 'anonymous') options.username = 'anonymous'; // no password: ANONYMOUS
    else if (job.sasl === 'plain') Object.assign(options, { username: job.username, password: job.password });
    else if (job.sasl !== 'none') throw new Error(`unknown sasl choice ${job.sasl}`);
    return options;
}

/** A symbol field that may hold one value or many, as a list. */
function symbols(value) {
    return value === undefined || value === null ? [] : [].concat(value);
}

const OUTCOMES = ['accepted', 'rejected', 'released', 'modified'];

module.exports = { rhea, VERSION, readJob, finish, deadline, plain, describe, connectOptions, symbols, OUTCOMES };
