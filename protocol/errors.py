"""The table of error replies.

Every error a node sends comes from here, so the texts match Disque's replies in one place.
Codes are the first word of the reply (``-BADID ...``); clients map them to exception types.
"""

from __future__ import annotations

from typing import Final

from protocol.resp import Error

SYNTAX: Final = Error("ERR syntax error")
BADID: Final = Error("BADID Invalid Job ID format.")
NOJOB: Final = Error("NOJOB Job not known in the context of this node.")
NOREPL: Final = Error("NOREPL Not enough reachable nodes for the requested replication level")
PAUSED_IN: Final = Error("PAUSED Queue paused in input, try later")
MAXLEN: Final = Error("MAXLEN Queue is already longer than the specified MAXLEN count")
LEAVING: Final = Error("LEAVING This node is leaving the cluster, please connect to a different one")
TOOLATE: Final = Error(
    "TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone the next delivery."
)
NOT_INTEGER: Final = Error("ERR value is not an integer or out of range")
BAD_TIMEOUT: Final = Error("ERR timeout is not an integer or out of range")
NEGATIVE_TIMEOUT: Final = Error("ERR timeout is negative")
RETRY0_REPLICATE: Final = Error(
    "ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 (at-most-once delivery)"
)
DELAY_GT_TTL: Final = Error(
    "ERR The specified DELAY is greater than TTL. Job refused since would never be delivered"
)
COUNT_POSITIVE: Final = Error("ERR COUNT must be a number greater than zero")
BAD_REPLICATE: Final = Error("ERR REPLICATE must be between 1 and 65535")
BAD_DELAY: Final = Error("ERR DELAY time must be a non negative number")
BAD_RETRY: Final = Error("ERR RETRY time must be a non negative number")
BAD_TTL: Final = Error("ERR TTL must be a number > 0")
BAD_MAXLEN: Final = Error("ERR MAXLEN must be a positive number")
BAD_PRIORITY: Final = Error("ERR PRIORITY must be an integer between 0 and 9")  # trisque's
BAD_CURSOR: Final = Error("ERR invalid cursor or option name")
NOAUTH: Final = Error("NOAUTH Authentication required.")
INVALID_PASSWORD: Final = Error("ERR invalid password")
NO_PASSWORD_SET: Final = Error("ERR Client sent AUTH, but no password is set")
WRONGPASS: Final = Error("WRONGPASS invalid username-password pair or user is disabled.")
NOPROTO: Final = Error("NOPROTO unsupported protocol version")
OOM: Final = Error("OOM command not allowed when used memory > 'maxmemory'.")
DISK_FULL: Final = Error("ERR append log is at 'maxdisk': command refused until a rewrite or "
                         "acknowledgements free space")
MAX_CLIENTS: Final = Error("ERR max number of clients reached")
# Protected mode (Redis's DENIED reply, in trisque's words; docs/security.md).
DENIED: Final = Error(
    "DENIED trisque is running in protected mode: no user has a password, so only clients on "
    "the loopback interface are answered. To accept this host, do one of these: 1) set a "
    "password for the default user (requirepass, or ACL SETUSER default >password) or create "
    "an ACL user with a password; 2) run 'CONFIG SET protected-mode no' from the loopback "
    "interface (then CONFIG REWRITE to keep it), making sure the node is not reachable from "
    "the internet; 3) set 'protected-mode no' in the configuration file and restart; 4) "
    "start the node with '--protected-mode no'.")
LOADING: Final = Error("LOADING Disque is loading the dataset in memory")


BAD_PROTOVER: Final = Error("ERR Protocol version is not an integer or out of range")
BAD_LEAVING_ARG: Final = Error("ERR Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")
BAD_CLUSTER_SUB: Final = Error("ERR Wrong CLUSTER subcommand or number of arguments")
NO_CLUSTER_BUS: Final = Error("ERR CLUSTER MEET needs the cluster bus, which this node does not run yet")
BAD_CONFIG_SUB: Final = Error("ERR CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE")
BAD_CLIENT_NAME: Final = Error(
    "ERR Client names cannot contain spaces, newlines or special characters.")
BAD_DB_INDEX: Final = Error("ERR DB index is out of range")
NO_SUCH_CLIENT: Final = Error("ERR No such client")
CLIENT_SYNTAX: Final = Error(
    "ERR Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME connection-name)")
LOADJOB_FROM_AOF: Final = Error("ERR LOADJOB is a special command only processed from AOF")
INVALID_NODE_ID: Final = Error("ERR Invalid node identifier")
CANT_FORGET_MYSELF: Final = Error("ERR I tried hard but I can't forget myself...")


def invalid_port(port: str) -> Error:
    return Error(f"ERR Invalid TCP port specified: {port}")


def invalid_node_address(ip: str, port: str) -> Error:
    return Error(f"ERR Invalid node address specified: {ip}:{port}")


def unknown_node(node_id: str) -> Error:
    return Error(f"ERR Unknown node {node_id}")


def hello_syntax(option: str) -> Error:
    return Error(f"ERR Syntax error in HELLO option '{option}'")


def config_arity(sub: str) -> Error:
    return Error("ERR Wrong number of arguments for CONFIG " + sub)


def debug_unknown(sub: str) -> Error:
    return Error(f"ERR Unknown DEBUG subcommand or wrong number of arguments for '{sub}'")


def unrecognized_option(option: str) -> Error:
    return Error(f"ERR Unrecognized option '{option}'")


def unknown_client_type(name: str) -> Error:
    return Error(f"ERR Unknown client type '{name}'")


def protocol_error(text: str) -> Error:
    """The reply to malformed input (the text is ``Protocol error: ...``)."""
    return Error("ERR " + text)


def too_big(option: str, limit: int) -> Error:
    return Error(f"ERR {option} must be at most {limit}")


def wrong_arity(name: str) -> Error:
    return Error(f"ERR wrong number of arguments for '{name.lower()}' command")


def unknown_command(name: str) -> Error:
    return Error(f"ERR unknown command '{name}'")


def unknown_subcommand(command: str, sub: str) -> Error:
    return Error(f"ERR Unknown {command} subcommand '{sub}'")


def err(text: str) -> Error:
    """An ``ERR`` reply with free text (OS errors, config errors)."""
    return Error("ERR " + text)
