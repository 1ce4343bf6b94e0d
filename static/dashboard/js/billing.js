// Billing: charges per API key, earnings per node wallet, recent records.

import { $, clock, fillRows, frameScheduler, h, int, money, shortId } from "./dom.js";

export function mountBilling(state) {
  const draw = () => {
    const billing = state.billing;
    if (!billing) return;
    $("billing-totals").textContent =
      `Charged in all: ${money(billing.totals.charged)} · refunded by audits: ${money(billing.totals.refunded)} · network fees: ${money(billing.totals.network_fees)}`;
    fillRows(
      $("billing-keys").tBodies[0],
      billing.api_keys.map((key) =>
        h(
          "tr",
          { dataset: { apiKey: key.name } },
          h("td", {}, key.name, " ", h("code", { class: "muted" }, `${key.prefix}…`), key.revoked ? " (revoked)" : ""),
          h("td", { class: "num" }, int(key.requests)),
          h("td", { class: "num" }, int(key.prompt_tokens)),
          h("td", { class: "num" }, int(key.completion_tokens)),
          h("td", { class: "num" }, money(key.charged)),
          h("td", { class: "num" }, money(key.refunded)),
        ),
      ),
    );
    fillRows(
      $("billing-wallets").tBodies[0],
      billing.wallets.map((wallet) =>
        h(
          "tr",
          {},
          h("td", {}, h("code", { title: wallet.wallet }, `${wallet.wallet.slice(0, 16)}…`)),
          h("td", { class: "num" }, int(wallet.nodes)),
          h("td", { class: "num" }, int(wallet.hops)),
          h("td", { class: "num" }, int(wallet.units)),
          h("td", { class: "num" }, money(wallet.earned)),
        ),
      ),
    );
    fillRows(
      $("billing-records").tBodies[0],
      billing.records.map((record) =>
        h(
          "tr",
          {},
          h("td", { class: "num" }, clock(record.created_at)),
          h("td", {}, h("code", { title: record.request_id }, shortId(record.request_id))),
          h("td", { dataset: { field: "api" } }, record.api || "—"),
          h("td", {}, record.api_key),
          h("td", { class: "num" }, `${int(record.prompt_tokens)} / ${int(record.completion_tokens)}`),
          h("td", { class: "num" }, money(record.charge)),
          h("td", { class: "num" }, money(record.network_fee)),
          h(
            "td",
            {},
            record.work_units.map((unit) =>
              h(
                "div",
                { class: "mono" },
                `${shortId(unit.node_id)}[${unit.start_layer}-${unit.end_layer}] `,
                `${int(unit.tokens)} × ${unit.end_layer - unit.start_layer + 1} = ${int(unit.units)} → ${money(unit.amount)}`,
              ),
            ),
          ),
        ),
      ),
    );
  };
  state.on("billing", frameScheduler(draw));
}
