"""The built-in help of `trisque`: every server command, its syntax and a one-line summary.

`help COMMAND` at the prompt prints one entry the way redis-cli does (name and arguments, then
the summary indented); `help` alone lists every command. Keep the table in the order of the
groups, as it is also the listing order.
"""

from __future__ import annotations

from typing import NamedTuple


class CommandHelp(NamedTuple):
    name: str
    args: str
    summary: str
    group: str


COMMANDS: tuple[CommandHelp, ...] = (
    CommandHelp("ADDJOB", "queue body ms-timeout [REPLICATE count] [DELAY sec] [RETRY sec] "
                "[TTL sec] [MAXLEN count] [ASYNC] [PRIORITY 0-9] [AFTER id ...]",
                "Add a job to a queue; replies with its ID once replicated (or at once with "
                "ASYNC); higher PRIORITY is served first; with AFTER it waits until those jobs "
                "are acked or resolved", "jobs"),
    CommandHelp("GETJOB", "[NOHANG] [TIMEOUT ms] [COUNT count] [WITHCOUNTERS] FROM queue "
                "[queue ...]",
                "Take up to COUNT jobs, one per queue in turn from left to right; with none "
                "ready, wait up to TIMEOUT ms (0: forever) unless NOHANG", "jobs"),
    CommandHelp("ACKJOB", "id [id ...]",
                "Acknowledge jobs as done; the cluster forgets them", "jobs"),
    CommandHelp("FASTACK", "id [id ...]",
                "Acknowledge jobs with a best-effort broadcast instead of the ack protocol",
                "jobs"),
    CommandHelp("NACK", "id [id ...]",
                "Put jobs back in their queue at once (after the queue's BACKOFF, if any), "
                "counting a negative acknowledge",
                "jobs"),
    CommandHelp("RESOLVE", "id result",
                "Acknowledge a job and keep its result for WAITJOB (result-ttl seconds)",
                "jobs"),
    CommandHelp("WAITJOB", "id [TIMEOUT ms]",
                "Wait until a job is resolved and reply its result (empty if acked without "
                "one); an error if it expired, was deleted or dead-lettered", "jobs"),
    CommandHelp("WORKING", "id",
                "Postpone the next delivery of a job still being worked on; replies the "
                "seconds gained", "jobs"),
    CommandHelp("ENQUEUE", "id [id ...]", "Queue jobs that are not queued", "jobs"),
    CommandHelp("DEQUEUE", "id [id ...]", "Remove jobs from their queue (they stay known)",
                "jobs"),
    CommandHelp("DELJOB", "id [id ...]", "Delete jobs from this node only", "jobs"),
    CommandHelp("SHOW", "id", "Describe a job: state, counters, nodes, body", "jobs"),
    CommandHelp("JSCAN", "[cursor] [COUNT count] [BUSYLOOP] [QUEUE queue] [STATE state ...] "
                "[REPLY all|id]", "Iterate over the jobs this node knows", "jobs"),
    CommandHelp("JOBRUN", "START id queue attempt worker pid | STATUS run line | APPEND run "
                "offset bytes | END run done|failed|resent|timeout|stopped exit-code|none "
                "reason | GET id | OUTPUT id [offset] | LIST [RUNNING] [COUNT n]",
                "Run records of script workers: a run's state, status lines, exit code and "
                "output tail, on the node the worker talks to (docs/worker.md)", "jobs"),
    CommandHelp("QLEN", "queue", "Number of jobs queued in a queue", "queues"),
    CommandHelp("QSTAT", "queue", "Describe a queue: length, age, rates, pause state, "
                "in-flight jobs and throttling",
                "queues"),
    CommandHelp("QPEEK", "queue count",
                "Show up to count jobs without taking them (negative count: newest first)",
                "queues"),
    CommandHelp("QSCAN", "[cursor] [COUNT count] [BUSYLOOP] [MINLEN len] [MAXLEN len] "
                "[IMPORTRATE rate]", "Iterate over the queues of this node", "queues"),
    CommandHelp("PAUSE", "queue in|out|all|none|state [BCAST]",
                "Pause a queue for input, output or both, or show its pause state", "queues"),
    CommandHelp("QPOLICY", "CREATE|UPDATE|SET queue [REDRIVE max-receives dead-letter-queue] "
                "[NOREDRIVE] [RETENTION sec] [VISIBILITY sec] [DELAY sec] [DEDUP yes|no] "
                "[BACKOFF base-sec max-sec] [MAXINFLIGHT n] [RATE per-sec] | "
                "GET queue | DEL queue | LIST [OFFSET n] [LIMIT n] | ORIGIN id | "
                "REDRIVE dead-letter-queue [COUNT n]",
                "Queue policies: default TTL, RETRY and DELAY, dead-letter queue (REDRIVE "
                "moves dead letters back), deduplication (docs/policies.md); backoff, "
                "throttling (docs/semantics.md)", "queues"),
    CommandHelp("TIMER", "ADD name period queue body [ADDJOB options] [START unix-ms] "
                "[REPLACE] | DEL name [name ...] | GET name | LIST | PAUSE name | "
                "RESUME name | FIRE name | HELP",
                "Periodic timers: add a job to a queue every period seconds, once per due "
                "time across the cluster (docs/timers.md)", "timers"),
    CommandHelp("HELLO", "[protover] [AUTH username password] [SETNAME clientname]",
                "This node's ID and every known node with its priority (with protover: "
                "the Redis 6 handshake)", "cluster"),
    CommandHelp("CLUSTER", "MEET ip port | NODES | MYID | INFO | SAVECONFIG | LEAVING [yes|no] | "
                "FORGET id | RESET [hard|soft]",
                "Join nodes, list them, or mark this node as leaving", "cluster"),
    CommandHelp("INFO", "[section]", "Node information and statistics", "server"),
    CommandHelp("PING", "[message]", "Check that the node answers", "server"),
    CommandHelp("CONFIG", "GET pattern | SET name value | REWRITE | RESETSTAT",
                "Read or change the configuration at run time", "server"),
    CommandHelp("AUTH", "[username] password", "Authenticate the connection (as an ACL user)",
                "server"),
    CommandHelp("ACL", "SETUSER name [rule ...] | GETUSER name | DELUSER name [name ...] | LIST | "
                "USERS | WHOAMI | CAT [category] | LOG [count|RESET] | SAVE | LOAD | "
                "GENPASS [bits] | DRYRUN name command [arg ...]",
                "ACL users: who may run which commands on which queues (docs/security.md)",
                "server"),
    CommandHelp("BGREWRITEAOF", "", "Rewrite the append log in the background", "server"),
    CommandHelp("SHUTDOWN", "[REWRITE-AOF]", "Stop the node (first rewriting the append log)",
                "server"),
    CommandHelp("DEBUG", "FLUSHALL | ...", "Testing and debugging commands", "server"),
    CommandHelp("CLIENT", "SETNAME name | GETNAME | ID | LIST | SETINFO LIB-NAME|LIB-VER value | "
                "KILL [ID id] [ADDR ip:port] [TYPE type] [SKIPME yes|no] | KILL ip:port",
                "Name this connection, list the connections, or close some", "server"),
    CommandHelp("MONITOR", "", "Stream every command the node receives", "server"),
    CommandHelp("TIME", "", "The node's clock: seconds and microseconds", "server"),
    CommandHelp("ECHO", "message", "Reply with the message", "server"),
    CommandHelp("SELECT", "index", "Accepted for Redis clients: only database 0 exists",
                "server"),
    CommandHelp("COMMAND", "[COUNT|DOCS]", "The command table: names, arities, flags",
                "server"),
    CommandHelp("QUIT", "", "Close the connection", "server"),
    CommandHelp("LOADJOB", "serialized-job",
                "Disque's append-log record: a client gets an error, as from Disque", "server"),
)

_BY_NAME = {c.name: c for c in COMMANDS}

#: Words the prompt handles itself; they never reach the node.
PROMPT_WORDS = ("help", "quit", "exit", "clear")


def lookup(name: str) -> CommandHelp | None:
    return _BY_NAME.get(name.upper())


def format_entry(entry: CommandHelp) -> str:
    return f"\n  {entry.name} {entry.args}".rstrip() + f"\n  summary: {entry.summary}\n" \
        f"  group: {entry.group}\n"


def help_text(topic: str | None) -> str:
    """What ``help [topic]`` prints at the prompt."""
    if not topic:
        lines = ["trisque commands (type \"help COMMAND\" for one of them):", ""]
        for c in COMMANDS:
            lines.append(f"  {c.name:<13}{c.summary}")
        lines += ["", "At the prompt: help [command], quit, exit, clear.", ""]
        return "\n".join(lines)
    if topic.startswith("@"):
        group = topic[1:].lower()
        entries = [format_entry(c) for c in COMMANDS if c.group == group]
        return "".join(entries) if entries else f"No commands in group '{group}'\n"
    entry = lookup(topic)
    if entry is None:
        return f"No help for '{topic}'. Type \"help\" for the list of commands.\n"
    return format_entry(entry)
