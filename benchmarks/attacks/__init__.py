"""Issues 9 and 22: attacks against real servers, measured; a tool for closing notes, not a test.

Each attack runs against a fresh server process on 127.0.0.1 (``python -m pairlink serve``, or
for the password attack a small server of this script with users), and sends only there. Per
attack it prints the server's RSS (``VmRSS`` of ``/proc/<pid>/status``) before and at most during
the attack, what the server did about it (the frames it answered with, read off the wire), and
whether a normal client, in a process of its own so that the attacker's CPU does not distort its
timings, was served meanwhile (``pairlink.connect``, ``echo("x")`` every 50 ms; p50 and max
latency). It asserts nothing: some attacks may still show the old behaviour while the hardening
is under way, and the table says what it sees.

- ``non-reading``: a paired link to ``bigbox`` (tests/hostile_services.py: 50,000 credit at
  once) with huge reply credit; 16 KiB echo requests for ``--seconds`` (60), the socket never
  read. Reports how many MiB the server took before it stopped reading.
- ``partial``: 8 links (a session each) each sending a message that never ends: transfers with
  more=true, 1 MiB per link per round in frames of the server's max-frame-size, until the
  server closes, stops reading, or 80 MiB per link. Reports the close/detach conditions.
- ``decode-bomb``: one 8 MiB ``amqp-value`` body, an array of 2-byte described elements (two
  objects each once decoded), sent unsettled to echo. Reports the reply/disposition/close and
  the normal client's max latency (the event loop must not stall for more than ~100 ms).
- ``many-links``: 10,000 paired request links on one connection (as many sessions as the
  server's handle-max needs), each pipelining one ``sleep(30)`` call to echo (mailbox 128).
  Reports how many calls the server held (neither refused nor answered) after ``hold`` seconds.
- ``silent``: 1,500 TCP connections that never send a byte, against a server whose file limit
  is 1,024 (a common default). Reports how many are still open after the handshake timeout
  (a non-blocking read returning EOF means closed); the normal client connects afresh per call.
- ``hoarders``: 50 connections (5 with ``--quick``), one paired request link each to echo,
  that take their credit and never send nor answer a drain, kept alive by heartbeats for 15 s;
  the normal client connects afresh per call, so it needs new credit every time. Reports which
  links the server detached, and with what condition.
- ``wrong-passwords``: 100 wrong-password logins one after another from 127.0.0.1, timed,
  while a right login from 127.0.0.2 is timed every 0.5 s (the "normal client" of this row).

Issue 22's rows, several parties sharing one server or gateway, are in :mod:`.tenants`
(``dedup-cross-caller``, ``dedup-memory``, ``links-per-process``, ``metrics-scrape``,
``running-slots``, ``connect-deadline``, ``worker-stop``) and :mod:`.gateways`
(``gateway-no-route``, ``health-route``, ``gateway-pairs``); the servers ``pairlink serve``
cannot start for them are in :mod:`.hosts`. The ``frames-<kind>`` rows (:mod:`.frames`) send
bursts of one frame kind and print the server's CPU time per byte sent against a heartbeat's.

``--code DIR`` runs the servers (and connect-deadline's client) from another pairlink checkout,
``DIR/framework`` first on their PYTHONPATH, the attackers staying ours: the same rows against
the code before a change and after it.

Every phase is bounded (``trio.fail_after``), every child process is killed on the way out
(and dies with this one), and an attack stops pushing (and reports what it did) once the
server's RSS passes ``--rss-limit``. Issue 9's rows take 2 minutes against a hardened server
and up to ~5 where calls time out, issue 22's about 4 (100 s of it links-per-process);
``--quick`` takes about a minute for the first, 90 s for the second.

The package: :mod:`.phases` (the bound of every wait), :mod:`.wire` (the attackers' hand-written
AMQP peer and the requests they send), :mod:`.children` (server and normal-client processes,
RSS), :mod:`.attacks` (the attacks, how hard they push, and every row's server),
:mod:`.tenants`, :mod:`.gateways` and :mod:`.hosts` (issue 22's), ``__main__`` (the driver and
the table).

Run: ``python -m benchmarks.attacks [--quick] [--seconds N] [--attack NAME[,NAME...]]
[--code DIR]``
"""
