// The identity provider of the sign-in tests: panva's certified `oidc-provider`, with one
// confidential client and the users the test names, each in its groups. Its development login
// form takes any password. Prints `listening <issuer>` once it accepts connections.
//
//   OIDC_CONFIG='{"port": 0, "client_id": "...", "client_secret": "...",
//                 "redirect_uris": ["http://127.0.0.1:8080/auth/callback"],
//                 "users": {"alice": {"name": "Alice", "groups": ["finance-team"]}}}' \
//     node provider.mjs
import http from "node:http";

import Provider from "oidc-provider";

const config = JSON.parse(process.env.OIDC_CONFIG);

const server = http.createServer();
await new Promise((resolve) => server.listen(config.port || 0, "127.0.0.1", resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: [{
    client_id: config.client_id,
    client_secret: config.client_secret,
    redirect_uris: config.redirect_uris,
    grant_types: ["authorization_code"],
    response_types: ["code"],
    token_endpoint_auth_method: "client_secret_basic",
  }],
  async findAccount(ctx, id) {
    const user = config.users[id];
    if (!user) return undefined;
    return {
      accountId: id,
      async claims() {
        return { sub: id, name: user.name, email: `${id}@example.com`, groups: user.groups };
      },
    };
  },
  claims: { openid: ["sub"], profile: ["name"], email: ["email"], groups: ["groups"] },
  scopes: ["openid", "profile", "email", "groups"],
  // The relying party reads the claims it maps from the ID token.
  conformIdTokenClaims: false,
  // A first-party application: the user is not asked to consent.
  async loadExistingGrant(ctx) {
    const grantId = ctx.oidc.result?.consent?.grantId
      || ctx.oidc.session.grantIdFor(ctx.oidc.client.clientId);
    if (grantId) return ctx.oidc.provider.Grant.find(grantId);
    const grant = new ctx.oidc.provider.Grant({
      clientId: ctx.oidc.client.clientId,
      accountId: ctx.oidc.session.accountId,
    });
    grant.addOIDCScope("openid profile email groups");
    await grant.save();
    return grant;
  },
  ttl: { IdToken: config.id_token_ttl || 3600 },
  cookies: { keys: ["taskledger-tests-only"] },
});
provider.on("server_error", (ctx, error) => console.error("server_error", error));

server.on("request", provider.callback());
console.log(`listening ${issuer}`);
