{{/*
One role's Deployment. Arguments (a dict): root, component, args (the duetime command line),
replicas (omitted: KEDA owns the count), env (extra DUETIME_* for this role), resources,
ports (name -> port, besides metrics), probe (an httpGet path on the port named probePort),
readinessPath, emptyDirs (mount path -> size limit), grace (termination grace in seconds).
Every role: the shared ConfigMap and Secret, metrics on metrics.port, /tmp writable.
*/}}
{{- define "duetime.deployment" -}}
{{- $root := .root -}}
{{- $name := printf "%s-%s" (include "duetime.fullname" $root) .component -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "duetime.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  {{- if hasKey . "replicas" }}
  replicas: {{ .replicas }}
  {{- end }}
  revisionHistoryLimit: 5
  strategy:
    type: RollingUpdate
    rollingUpdate:
      # one process at a time: partitions move through the consumer group (operations.md)
      maxUnavailable: 0
      maxSurge: 1
  selector:
    matchLabels:
      {{- include "duetime.selector" (dict "root" $root "component" .component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "duetime.selector" (dict "root" $root "component" .component) | nindent 8 }}
      annotations:
        # a changed ConfigMap or Secret rolls the pods (they read the environment once, at start)
        checksum/config: {{ include (print $root.Template.BasePath "/config.yaml") $root | sha256sum }}
        {{- if $root.Values.metrics.podAnnotations }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $root.Values.metrics.port | quote }}
        prometheus.io/path: /metrics
        {{- end }}
    spec:
      serviceAccountName: {{ include "duetime.serviceAccountName" $root }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: {{ .grace | default 30 }}
      containers:
        - name: {{ .component }}
          image: {{ include "duetime.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- toYaml .args | nindent 12 }}
          envFrom:
            - configMapRef:
                name: {{ include "duetime.fullname" $root }}
            - secretRef:
                name: {{ include "duetime.secretName" $root }}
          env:
            # names the process in client ids, results and leases
            - name: DUETIME_INSTANCE_ID
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            {{- range $key, $value := .env }}
            - name: {{ $key }}
              value: {{ $value | toString | quote }}
            {{- end }}
          ports:
            - name: metrics
              containerPort: {{ $root.Values.metrics.port }}
              protocol: TCP
            {{- range $portName, $port := .ports }}
            - name: {{ $portName }}
              containerPort: {{ $port }}
              protocol: TCP
            {{- end }}
          startupProbe:
            httpGet:
              path: {{ .probe }}
              port: {{ .probePort | default "metrics" }}
            periodSeconds: 2
            # a scheduler restores its partitions from the changelog before it is busy
            failureThreshold: 60
          livenessProbe:
            httpGet:
              path: {{ .probe }}
              port: {{ .probePort | default "metrics" }}
            periodSeconds: 10
            timeoutSeconds: 5
            failureThreshold: 6
          {{- if .readinessPath }}
          readinessProbe:
            httpGet:
              path: {{ .readinessPath }}
              port: {{ .probePort | default "metrics" }}
            periodSeconds: 5
            timeoutSeconds: 5
            failureThreshold: 3
          {{- end }}
          resources:
            {{- toYaml .resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            - name: tmp
              mountPath: /tmp
            {{- range $path, $size := .emptyDirs }}
            - name: {{ $path | trimPrefix "/" | replace "/" "-" }}
              mountPath: {{ $path }}
            {{- end }}
      volumes:
        - name: tmp
          emptyDir: {}
        {{- range $path, $size := .emptyDirs }}
        - name: {{ $path | trimPrefix "/" | replace "/" "-" }}
          emptyDir:
            sizeLimit: {{ $size }}
        {{- end }}
      {{- with $root.Values.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $root.Values.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- if $root.Values.affinity }}
        {{- toYaml $root.Values.affinity | nindent 8 }}
        {{- else }}
        # replicas on different nodes where possible: a node loss takes one of each role
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "duetime.selector" (dict "root" $root "component" .component) | nindent 20 }}
        {{- end }}
{{- end -}}
