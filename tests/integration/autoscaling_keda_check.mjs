// Validates KEDA objects (a JSON list on stdin) with KEDA's own models: the npm package
// @kubernetes-models/keda, generated from KEDA's API (its CRDs' schemas), installed by .ci/run
// in build/keda-models. Prints one JSON list: null for a valid object, else the reason.
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { TriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication";

const kinds = { ScaledObject, TriggerAuthentication };
let text = "";
for await (const chunk of process.stdin) text += chunk;
const verdicts = JSON.parse(text).map((object) => {
  try {
    new kinds[object.kind](object).validate();
    return null;
  } catch (error) {
    return String(error.message || error);
  }
});
console.log(JSON.stringify(verdicts));
