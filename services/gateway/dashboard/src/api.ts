// The API client: generated from openapi/openapi.json (src/api/schema.d.ts, by
// openapi-typescript), called through openapi-fetch. Nothing here spells a response shape.
import createClient, { type Middleware } from "openapi-fetch";
import type { components, paths } from "./api/schema";

export type Schemas = components["schemas"];

const TOKEN_KEY = "thorn.token";

export const token = {
  get: (): string | null => sessionStorage.getItem(TOKEN_KEY),
  set: (value: string): void => sessionStorage.setItem(TOKEN_KEY, value.trim()),
  clear: (): void => sessionStorage.removeItem(TOKEN_KEY),
};

const bearer: Middleware = {
  onRequest({ request }) {
    const secret = token.get();
    if (secret) request.headers.set("Authorization", `Bearer ${secret}`);
    return request;
  },
};

export const api = createClient<paths>({ baseUrl: location.origin });
api.use(bearer);

/** A refused or failed request, with what to tell the person in plain words. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

export let role = "viewer"; // the signed-in token's role, from /whoami

export function setRole(value: string): void {
  role = value;
}

/** The service's own words (`detail`), framed for a person. */
export function inWords(status: number, body: unknown): string {
  const detail = (body as { detail?: unknown } | undefined)?.detail;
  const said = typeof detail === "string" ? detail : "";
  switch (status) {
    case 401:
      return "Not signed in: the token is missing, unknown, expired or revoked. Sign in again.";
    case 403:
      return `Not allowed: your token's role (${role}) may not do this. ${said}`.trim();
    case 404:
      return said || "Not found.";
    case 409:
      return said ? `Not now: ${said}` : "Not now: the controller is busy; try again.";
    case 413:
      return "Too large for the controller to take.";
    case 422:
      return said ? `Check the input: ${said}` : "Check the input.";
    case 502:
    case 503:
    case 504:
      return `A THORN service is unavailable: ${said || `HTTP ${status}`}`;
  }
  return said || `The request failed (HTTP ${status}).`;
}

type Result<T> = { data?: T; error?: unknown; response: Response };

/** The data of an answered request, or an ApiError in words. */
export async function must<T>(request: Promise<Result<T>>): Promise<T> {
  let result: Result<T>;
  try {
    result = await request;
  } catch {
    throw new ApiError(0, "The controller does not answer: is `make run` still running?");
  }
  const { data, error, response } = result;
  if (!response.ok || data === undefined) {
    throw new ApiError(response.status, inWords(response.status, error));
  }
  return data;
}

const PAGE = 1000; // the API's largest page

/** Every item of a paginated list. */
export async function everything<T>(
  page: (offset: number, limit: number) => Promise<Result<{ items: T[]; total: number }>>,
): Promise<T[]> {
  const items: T[] = [];
  for (let offset = 0; ; offset += PAGE) {
    const got = await must(page(offset, PAGE));
    items.push(...got.items);
    if (got.items.length < PAGE || items.length >= got.total) return items;
  }
}
