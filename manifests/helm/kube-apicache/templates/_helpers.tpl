{{/*
The image of the agent and the approver: repository@digest when a digest
is set, else repository:tag.
*/}}
{{- define "kube-apicache.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/*
The labels of every object, as the kustomize base sets them: the
component's name (the argument) and app.kubernetes.io/part-of. No Helm
labels, so that the chart and the base render the same objects.
*/}}
{{- define "kube-apicache.labels" -}}
app.kubernetes.io/name: {{ . }}
app.kubernetes.io/part-of: kube-apicache
{{- end -}}

{{/*
The agents' ServiceAccount as a subject.
*/}}
{{- define "kube-apicache.agentSubject" -}}
- kind: ServiceAccount
  name: kube-apicache
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/*
Whether the approver runs: not where the agents bring their own
certificate.
*/}}
{{- define "kube-apicache.approver" -}}
{{- if and .Values.approver.enabled (not .Values.certificate.secretName) }}true{{ end -}}
{{- end -}}
