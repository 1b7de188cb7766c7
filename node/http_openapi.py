"""The OpenAPI document of the HTTP API (``GET /openapi.json``), and the limits it states.

It describes what node/http_api.py serves; tests/http/test_openapi.py runs schemathesis
against it on a real node, so a route, status or shape that drifts from it fails the suite.
"""

from __future__ import annotations

from typing import Any, Final

MAX_WAIT_S: Final = 60  # longest long poll
MAX_COUNT: Final = 100  # largest batch receive
MAX_PRIORITY: Final = 9  # ADDJOB's PRIORITY
QUEUE_FIELDS: Final = ("redrive_policy", "retention_timeout", "visibility_timeout",
                        "message_delay", "message_deduplication")

_ERR = {"description": "Error", "content": {"application/json": {"schema": {
    "$ref": "#/components/schemas/Error"}}}}
_POLICY_PROPS = {
    "redrive_policy": {"oneOf": [{"type": "null"}, {
        "type": "object", "additionalProperties": False,
        "required": ["max_receives", "dead_letter_queue"],
        "properties": {"max_receives": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                       "dead_letter_queue": {"type": "string", "minLength": 1}}}]},
    "retention_timeout": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
    "visibility_timeout": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1},
    "message_delay": {"type": "integer", "minimum": 0, "maximum": 2**31 - 2},
    "message_deduplication": {"type": "boolean"},
}
_QUEUE_NAME = {"name": "name", "in": "path", "required": True,
               "schema": {"type": "string", "minLength": 1, "pattern": "^[A-Za-z0-9_.-]+$"}}
# GET of messages, mqs's and MQ's routes alike: long polling and batches.
_RECEIVE_PARAMS = [
    {"name": "wait", "in": "query",
     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_WAIT_S}},
    {"name": "count", "in": "query",
     "schema": {"type": "integer", "minimum": 1, "maximum": MAX_COUNT}}]
_AFTER = [{"name": "after", "in": "query", "description": "A message ID this one waits for "
           "(acknowledged or resolved) before it is queued; repeat for several",
           "schema": {"type": "array", "items": {"type": "string"}}, "style": "form",
           "explode": True}]
_MQ_QUEUE = dict(_QUEUE_NAME, name="queue")
_MSG_HEADERS = {"X-MQS-MESSAGE-ID": {"schema": {"type": "string"}},
                "X-Message-Id": {"schema": {"type": "string"}}}
_RETRY = {"description": "Not stored durably (log write failed), out of memory or paused: "
                         "retry after Retry-After seconds",
          "headers": {"Retry-After": {"schema": {"type": "integer"}}},
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_ANY_BODY = {"content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}}
_PUBLISH_PARAMS = [
    {"name": "priority", "in": "query", "description": "0 to 9, higher served first "
                                                        "(ADDJOB's PRIORITY, docs/semantics.md)",
     "schema": {"type": "integer", "minimum": 0, "maximum": MAX_PRIORITY}}]
OPENAPI: Final[dict[str, Any]] = {
    "openapi": "3.0.3",
    "info": {"title": "trisque HTTP API", "version": "1",
             "description": "mqs and MQ routes over trisque's queues (docs/http.md)."},
    "components": {
        "schemas": {
            "Error": {"type": "object", "required": ["error"],
                      "properties": {"error": {"type": "string"}}},
            "QueueIn": {"type": "object", "additionalProperties": False,
                        "properties": _POLICY_PROPS},
            "Queue": {"type": "object", "required": ["name", *QUEUE_FIELDS],
                      "properties": {"name": {"type": "string"}, **_POLICY_PROPS}},
            "QueueStatus": {"allOf": [{"$ref": "#/components/schemas/Queue"}, {
                "type": "object", "required": ["status"], "properties": {"status": {
                    "type": "object",
                    "required": ["messages", "visible_messages", "oldest_message_age"],
                    "properties": {k: {"type": "integer"} for k in
                                   ("messages", "visible_messages", "oldest_message_age")}}}}]},
        },
        "securitySchemes": {"basic": {"type": "http", "scheme": "basic"},
                            "bearer": {"type": "http", "scheme": "bearer"}},
    },
    "security": [{}, {"basic": []}, {"bearer": []}],
    "paths": {
        "/queues": {"get": {
            "parameters": [
                {"name": "offset", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 0}}],
            "responses": {"200": {"description": "Queues", "content": {"application/json": {
                "schema": {"type": "object", "required": ["total", "queues"], "properties": {
                    "total": {"type": "integer"},
                    "queues": {"type": "array",
                               "items": {"$ref": "#/components/schemas/Queue"}}}}}}},
                "400": _ERR, "401": _ERR}}},
        "/queues/{name}": {
            "parameters": [_QUEUE_NAME],
            "get": {"responses": {"200": {"description": "The queue", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/QueueStatus"}}}},
                "404": _ERR, "401": _ERR}},
            "put": {"requestBody": {"content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/QueueIn"}}}},
                "responses": {"201": {"description": "Created", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Queue"}}}},
                    "400": _ERR, "409": _ERR, "408": _ERR, "413": _ERR, "401": _ERR,
                    "503": _RETRY}},
            "post": {"requestBody": {"content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/QueueIn"}}}},
                "responses": {"200": {"description": "Updated", "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/Queue"}}}},
                    "400": _ERR, "404": _ERR, "408": _ERR, "413": _ERR, "401": _ERR,
                    "503": _RETRY}},
            "delete": {"responses": {"200": {"description": "Deleted", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Queue"}}}},
                "404": _ERR, "401": _ERR, "503": _RETRY}},
        },
        "/queues/{name}/redrive": {
            "parameters": [_QUEUE_NAME],
            "post": {
                "description": "Move the dead letters queued on this node in this "
                               "dead-letter queue back to their original queues (QPOLICY "
                               "REDRIVE, docs/policies.md); with job, only that one.",
                "parameters": [{"name": "count", "in": "query", "schema": {
                    "type": "integer", "minimum": 1, "maximum": 2**31 - 1}},
                    {"name": "job", "in": "query", "description": "A dead letter's ID",
                     "schema": {"type": "string"}}],
                "responses": {"200": {"description": "Moved", "content": {"application/json": {
                    "schema": {"type": "object", "required": ["moved"],
                               "properties": {"moved": {"type": "integer"}}}}}},
                    "400": _ERR, "403": _ERR, "404": _ERR, "401": _ERR, "503": _RETRY}},
        },
        "/messages/{name}": {
            "parameters": [{"name": "name", "in": "path", "required": True,
                            "description": "A queue (GET, POST) or a message ID (DELETE; "
                                           "send / as %2F)", "schema": {"type": "string"}}],
            "post": {"requestBody": _ANY_BODY, "parameters": _PUBLISH_PARAMS + _AFTER, "responses": {
                "200": {"description": "Duplicate: the existing message",
                        "headers": _MSG_HEADERS},
                "201": {"description": "Published", "headers": _MSG_HEADERS},
                "400": _ERR, "404": _ERR, "408": _ERR, "413": _ERR, "401": _ERR,
                "503": _RETRY}},
            "get": {"parameters": _RECEIVE_PARAMS,
                "responses": {
                    "200": {"description": "A message (raw body, its Content-Type), or with "
                                           "count a JSON batch", "headers": _MSG_HEADERS,
                            "content": {"*/*": {"schema": {}}}},
                    "204": {"description": "No message"},
                    "400": _ERR, "404": _ERR, "401": _ERR}},
            "delete": {"responses": {"204": {"description": "Deleted"}, "400": _ERR,
                                     "404": _ERR, "401": _ERR, "503": _RETRY}},
        },
        "/results/{id}": {
            "parameters": [{"name": "id", "in": "path", "required": True,
                            "description": "A message ID (send / as %2F)",
                            "schema": {"type": "string"}}],
            "put": {"requestBody": _ANY_BODY, "responses": {
                "200": {"description": "Acknowledged with this result (RESOLVE): how many "
                                       "messages this node knew (0 or 1)",
                        "content": {"application/json": {"schema": {
                            "type": "object", "required": ["resolved"],
                            "properties": {"resolved": {"type": "integer"}}}}}},
                "400": _ERR, "404": _ERR, "408": _ERR, "413": _ERR, "401": _ERR,
                "503": _RETRY}},
            "get": {"parameters": _RECEIVE_PARAMS[:1], "responses": {
                "200": {"description": "The result (empty: acknowledged without one)",
                        "content": {"application/octet-stream": {"schema": {
                            "type": "string", "format": "binary"}}}},
                "204": {"description": "Not resolved yet (within wait seconds)"},
                "400": _ERR, "404": _ERR, "401": _ERR,
                "410": {"description": "Expired, deleted or dead-lettered before it was "
                                       "acknowledged", "content": {"application/json": {
                                           "schema": {"$ref": "#/components/schemas/Error"}}}}}},
        },
        "/mq/{queue}": {
            "parameters": [_MQ_QUEUE],
            "get": {"responses": {"200": {"description": "Exists"}, "404": {
                "description": "No such queue"}, "401": _ERR}},
            "put": {"responses": {"200": {"description": "Exists"},
                                  "201": {"description": "Created"}, "400": _ERR,
                                  "408": _ERR, "413": _ERR, "401": _ERR, "503": _RETRY}},
            "delete": {"responses": {"200": {"description": "Deleted"}, "404": _ERR,
                                     "401": _ERR, "503": _RETRY}},
        },
        "/mq/{queue}/messages": {
            "parameters": [_MQ_QUEUE],
            "post": {"requestBody": _ANY_BODY, "parameters": _PUBLISH_PARAMS + _AFTER, "responses": {
                "200": {"description": "Duplicate", "headers": _MSG_HEADERS},
                "201": {"description": "Stored", "headers": _MSG_HEADERS},
                "400": _ERR, "404": _ERR, "408": _ERR, "413": _ERR, "401": _ERR,
                "503": _RETRY}},
            "get": {"parameters": _RECEIVE_PARAMS,
                "responses": {"200": {"description": "A message", "headers": _MSG_HEADERS,
                                      "content": {"*/*": {"schema": {}}}},
                              "204": {"description": "No message"},
                              "400": _ERR, "404": _ERR, "401": _ERR}},
        },
        "/mq/{queue}/messages/{id}": {
            "parameters": [_MQ_QUEUE, {"name": "id", "in": "path", "required": True,
                                       "schema": {"type": "string"}}],
            "delete": {"responses": {"204": {"description": "Deleted"}, "400": _ERR,
                                     "404": _ERR, "401": _ERR, "503": _RETRY}},
        },
    },
}
