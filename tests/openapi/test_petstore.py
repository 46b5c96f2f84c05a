"""Swagger's Petstore (3.0, 3.1) and the OpenAPI examples' (Swagger 2.0, one file and split over five) served
as tools, called through a real MCP client over HTTP against a stand-in that checks every request with
openapi-core or bravado-core."""

from __future__ import annotations

import json
from typing import Any

import trio

from kit.clients import bearer_client
from kit.openapi_standin import DOCUMENTS, read, standin
from kit.servers import http_server, make_config
from mcpipe.server import open_app


def _config(spec: str, base_url: str, **extra: Any) -> Any:
    return make_config(openapi={"petstore": {"spec": str(DOCUMENTS / spec), "base_url": base_url, **extra}})


def _structured(result: Any) -> Any:
    return result.structured_content


async def test_petstore_3_0_operations_are_tools_whose_calls_the_document_accepts(monkeypatch: Any) -> None:
    monkeypatch.setenv("PETS_KEY", "special-key")
    with trio.fail_after(60):
        async with standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api:
            config = make_config(
                {"PETS_KEY": "special-key"},
                openapi={
                    "petstore": {
                        "spec": str(DOCUMENTS / "swagger-petstore-3.0.yaml"),
                        "base_url": api.url,
                        "auth": {"api_key": {"credential": "pets"}},
                    }
                },
                credentials={"pets": {"kind": "env", "env": "PETS_KEY"}},
            )
            async with open_app(config) as app, http_server(app) as url, bearer_client(url, None) as client:
                listed = {
                    t.name: t.model_dump(by_alias=True, exclude_none=True) for t in (await client.list_tools()).tools
                }
                by_id = await client.call_tool("petstore.getPetById", {"petId": 7})
                found = await client.call_tool("petstore.findPetsByStatus", {"status": "sold"})
                tagged = await client.call_tool("petstore.findPetsByTags", {"tags": ["a", "b"]})
                added = await client.call_tool(
                    "petstore.addPet",
                    {
                        "body": {
                            "name": "doggie",
                            "photoUrls": ["u"],
                            "status": "available",
                            "category": {"id": 1, "name": "Dogs"},
                        }
                    },
                )
                form = await client.call_tool(
                    "petstore.updatePetWithForm", {"petId": 7, "name": "rex", "status": "sold"}
                )
                order = await client.call_tool(
                    "petstore.placeOrder", {"body": {"id": 1, "petId": 7, "quantity": 2, "status": "placed"}}
                )
                deleted = await client.call_tool("petstore.deletePet", {"petId": 7, "api_key": "k"})
                bad = await client.call_tool("petstore.getPetById", {"petId": "seven"})
    assert len([n for n in listed if n.startswith("petstore.")]) == 19
    schema = listed["petstore.getPetById"]["inputSchema"]
    assert schema["required"] == ["petId"] and schema["properties"]["petId"]["type"] == "integer"
    assert listed["petstore.addPet"]["inputSchema"]["properties"]["body"]["$ref"] == "#/$defs/Pet"
    assert "Pet" in listed["petstore.addPet"]["inputSchema"]["$defs"]
    assert listed["petstore.getPetById"]["annotations"]["readOnlyHint"] is True
    assert listed["petstore.deletePet"]["annotations"]["destructiveHint"] is True
    assert not api.invalid, [(s.method, s.path, s.errors) for s in api.invalid]
    assert [s.operation for s in api.seen] == [
        "getPetById", "findPetsByStatus", "findPetsByTags", "addPet", "updatePetWithForm", "placeOrder", "deletePet",
    ]  # fmt: skip
    assert _structured(by_id)["path"] == "/api/v3/pet/7" and not by_id.is_error
    assert api.seen[2].query == [("tags", "a"), ("tags", "b")]
    assert _structured(added)["body"]["name"] == "doggie"
    assert json.loads(order.content[0].text)["body"]["quantity"] == 2
    assert api.seen[6].headers.get("api_key") == "k"  # the parameter: deletePet's security is OAuth 2 only
    assert api.seen[0].headers.get("api_key") == "special-key"  # getPetById accepts the API key scheme
    assert bad.is_error and "args.petId" in bad.content[0].text and len(api.seen) == 7
    assert not (found.is_error or tagged.is_error or form.is_error or deleted.is_error)


async def test_petstore_3_1_serves_what_resolves_and_refuses_the_operations_whose_refs_do_not_located() -> None:
    with trio.fail_after(60):
        async with (
            standin(read("swagger-petstore-3.1.yaml"), prefix="/api/v31") as api,
            open_app(_config("swagger-petstore-3.1.yaml", api.url)) as app,
        ):
            source = app.gateway.get("petstore.getPetById")
            assert source is not None
            apis = next(s for s in app.gateway.sources if hasattr(s, "apis")).apis[0]
            async with http_server(app) as url, bearer_client(url, None) as client:
                got = await client.call_tool("petstore.getPetById", {"petId": 3})
                found = await client.call_tool("petstore.findPetsByStatus", {"status": "pending"})
    assert apis.version == "3.1" and sorted(apis.tools) == [
        "petstore.deletePet", "petstore.findPetsByStatus", "petstore.findPetsByTags", "petstore.getPetById",
    ]  # fmt: skip
    # The document's `$ref: #/...` is unquoted, so YAML reads a comment: the two operations taking a Pet are refused.
    assert [(r.location, r.reason) for r in apis.refused] == [
        ("paths./pet.put", "a `$ref` is a string, not null"),
        ("paths./pet.post", "a `$ref` is a string, not null"),
    ]
    assert not got.is_error and not found.is_error and not api.invalid and len(api.seen) == 2


async def test_swagger_2_0_petstores_one_file_and_split_over_five_are_tools_bravado_accepts() -> None:
    with trio.fail_after(60):
        async with (
            standin(read("oai-petstore-2.0.json"), prefix="/v1") as one,
            open_app(_config("oai-petstore-2.0.json", one.url)) as app,
            http_server(app) as url,
            bearer_client(url, None) as client,
        ):
            listed = [t.name for t in (await client.list_tools()).tools if t.name.startswith("petstore.")]
            pets = await client.call_tool("petstore.listPets", {"limit": 5})
            made = await client.call_tool("petstore.createPets", {})
            shown = await client.call_tool("petstore.showPetById", {"petId": "42"})
    assert sorted(listed) == ["petstore.createPets", "petstore.listPets", "petstore.showPetById"]
    assert not one.invalid and [s.operation for s in one.seen] == ["listPets", "createPets", "showPetById"]
    assert one.seen[0].query == [("limit", "5")] and not (pets.is_error or made.is_error or shown.is_error)
    split = read("oai-petstore-separate-2.0/spec/swagger.yaml")
    with trio.fail_after(60):
        origin = (DOCUMENTS / "oai-petstore-separate-2.0/spec/swagger.yaml").as_uri()
        async with standin(split, prefix="/api", origin=origin) as api:
            config = _config("oai-petstore-separate-2.0/spec/swagger.yaml", api.url)
            async with open_app(config) as app, http_server(app) as url, bearer_client(url, None) as client:
                listed = {t.name: t.model_dump(by_alias=True) for t in (await client.list_tools()).tools}
                found = await client.call_tool("petstore.findPets", {"tags": ["cat", "dog"], "limit": 3})
                added = await client.call_tool("petstore.addPet", {"pet": {"id": 1, "name": "Tom", "tag": "cat"}})
                gone = await client.call_tool("petstore.deletePet", {"id": 9})
    # The body's schema is `NewPet.yaml`'s, named from its file (an `allOf` of `Pet.yaml`, so it needs an `id` too);
    # the tags parameter came from `parameters.yaml`.
    schema = listed["petstore.addPet"]["inputSchema"]
    assert schema["properties"]["pet"]["$ref"] == "#/$defs/NewPet" and schema["required"] == ["pet"]
    assert listed["petstore.findPets"]["inputSchema"]["properties"]["tags"]["type"] == "array"
    assert not api.invalid, [(s.path, s.errors) for s in api.invalid]
    assert api.seen[0].query == [("tags", "cat,dog"), ("limit", "3")]  # collectionFormat csv
    assert json.loads(api.seen[1].body) == {"id": 1, "name": "Tom", "tag": "cat"} and not (
        found.is_error or added.is_error or gone.is_error
    )


async def test_a_call_past_its_deadline_answers_timeout_and_a_document_that_cannot_be_read_is_refused_located(
    tmp_path: Any,
) -> None:
    from kit.llm import lifespan, serving
    from mcpipe.errors import ConfigError

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        """An API that never answers (until the server stops)."""
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        else:
            await trio.sleep_forever()

    with trio.fail_after(30):
        async with serving(slow) as base:
            config = _config("swagger-petstore-3.0.yaml", base + "/api/v3", timeout_ms=200)
            async with open_app(config) as app, http_server(app) as url, bearer_client(url, None) as client:
                late = await client.call_tool("petstore.getPetById", {"petId": 1})
    assert late.is_error and late.content[0].text.startswith("TIMEOUT: petstore.getPetById: no answer within 200 ms")
    (tmp_path / "broken.yaml").write_text("openapi: [unclosed\n")
    (tmp_path / "old.json").write_text('{"swagger": "1.2"}')
    for name, says in (
        ("broken.yaml", "not valid YAML"),
        ("old.json", "Swagger 1.2 is not read"),
        ("none.json", "cannot read"),
    ):
        config = make_config(openapi={"api": {"spec": str(tmp_path / name), "base_url": "http://127.0.0.1:9"}})
        try:
            async with open_app(config):
                raise AssertionError("served")
        except ConfigError as exc:
            assert [p.location for p in exc.problems] == ["openapi.api.spec"] and says in exc.problems[0].message


async def test_an_operation_is_a_declared_pipelines_step_and_a_misnamed_one_is_refused_at_load() -> None:
    pipeline = {
        "name": "pet_and_order",
        "input_schema": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
        "steps": [
            {"kind": "tool", "id": "pet", "tool": "petstore.getPetById", "args": {"petId": "${args.id}"}},
            {"kind": "tool", "id": "order", "tool": "petstore.getOrderById", "args": {"orderId": 3}},
        ],
        "output": {"pet": "${steps.pet.output.path}", "order": "${steps.order.output.path}"},
    }
    with trio.fail_after(60):
        async with (
            standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api,
            open_app(make_config(**_config_doc(api.url), pipelines=[pipeline])) as app,
            http_server(app) as url,
            bearer_client(url, None) as client,
        ):
            answer = await client.call_tool("pet_and_order", {"id": 8})
        wrong = {**pipeline, "steps": [{**pipeline["steps"][0], "tool": "petstore.getPetByIdd"}, pipeline["steps"][1]]}
        from mcpipe.errors import ConfigError

        try:
            async with open_app(make_config(**_config_doc("http://127.0.0.1:9"), pipelines=[wrong])):
                raise AssertionError("served")
        except ConfigError as exc:
            refused = exc.problems
    assert not answer.is_error, answer.content
    assert answer.structured_content == {"pet": "/api/v3/pet/8", "order": "/api/v3/store/order/3"}
    assert [s.operation for s in api.seen] == ["getPetById", "getOrderById"] and not api.invalid
    assert [p.location for p in refused] == ["pipelines.pet_and_order.steps[0].tool"]
    assert "petstore.getPetById" in refused[0].message  # did you mean


def _config_doc(url: str) -> dict[str, Any]:
    return {"openapi": {"petstore": {"spec": str(DOCUMENTS / "swagger-petstore-3.0.yaml"), "base_url": url}}}


async def test_a_document_fetched_by_url_goes_through_the_outbound_policy_and_may_not_name_local_files(
    tmp_path: Any,
) -> None:
    from kit.llm import lifespan, serving
    from mcpipe.errors import ConfigError

    petstore = (DOCUMENTS / "swagger-petstore-3.0.yaml").read_bytes()
    sneaky = json.dumps(
        {
            "openapi": "3.0.3",
            "info": {"title": "t", "version": "1"},
            "paths": {
                "/x": {"post": {"operationId": "x", "requestBody": {"$ref": (tmp_path / "local.json").as_uri()}}}
            },
        }
    ).encode()
    (tmp_path / "local.json").write_text('{"content": {"application/json": {"schema": {"type": "object"}}}}')

    async def documents(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        body = petstore if scope["path"] == "/petstore.yaml" else sneaky
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/yaml")]})
        await send({"type": "http.response.body", "body": body})

    with trio.fail_after(60):
        async with serving(documents) as docs, standin(read("swagger-petstore-3.0.yaml"), prefix="/api/v3") as api:
            fetched = make_config(openapi={"petstore": {"spec": f"{docs}/petstore.yaml", "base_url": api.url}})
            async with open_app(fetched) as app, http_server(app) as url, bearer_client(url, None) as client:
                got = await client.call_tool("petstore.getPetById", {"petId": 2})
            named = docs.replace("127.0.0.1", "localhost")  # a name resolving to loopback: not a public address
            by_name = make_config(openapi={"petstore": {"spec": f"{named}/petstore.yaml", "base_url": api.url}})
            try:
                async with open_app(by_name):
                    raise AssertionError("served")
            except ConfigError as exc:
                refused = exc.problems
            local = make_config(openapi={"sneaky": {"spec": f"{docs}/sneaky.json", "base_url": api.url}})
            async with open_app(local) as app:
                sneaked = next(s for s in app.gateway.sources if hasattr(s, "apis")).apis[0]
    assert not got.is_error and [s.operation for s in api.seen] == ["getPetById"] and not api.invalid
    assert [p.location for p in refused] == ["openapi.petstore.spec"] and "resolves to" in refused[0].message
    assert not sneaked.tools and [r.location for r in sneaked.refused] == ["paths./x.post"]
    assert "does not resolve" in sneaked.refused[0].reason  # the fetched document's file:// $ref was never read
