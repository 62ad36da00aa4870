// Swagger UI over this coordinator's OpenAPI document. Everything comes from this origin (the
// Content-Security-Policy allows nothing else); the online validator badge is off, since it
// would send the document to another site.
"use strict";
window.addEventListener("DOMContentLoaded", function () {
  window.ui = SwaggerUIBundle({
    url: "/api/v1/openapi.json",
    dom_id: "#swagger-ui",
    validatorUrl: null,
    deepLinking: true,
    persistAuthorization: false,
  });
});
